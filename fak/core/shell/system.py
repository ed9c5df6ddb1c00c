"""Commands that act on the machine or the session: schedulers and services, signals, firewalls and logs,
accounts and keys, the environment, aliases, make recipes, other agents' CLIs."""

from __future__ import annotations

import re

from fak.core.shell.argv import (
    _SECRET_NAMES,
    FIREWALLS,
    NET_CLIENTS,
    SEARCHERS,
    _alts,
    _downstream,
    _downstream_net,
    _first,
    _host_of,
    _name,
    _opts_and_args,
)
from fak.core.shell.parse import SECRET, Cmd, Word
from fak.core.shell.targets import UNKNOWN, classify, display, resolve


class SystemCommands:
    """A family of Judge's command handlers (c_<name>), mixed into fak.core.shell.commands.Judge."""


    def env_dump(self, c: Cmd) -> None:
        """env / printenv with no name: the environment, sent out, or filtered for its keys into the context."""
        down = _downstream(c)
        peer = next((m for m in down if _name(m) in NET_CLIENTS), None)
        if peer is not None:
            self.add("send", "the environment", "credential", f"{_name(c)} | {_name(peer)} {_host_of(peer)}")
        elif any(_name(m) in SEARCHERS and any(_SECRET_NAMES.search(a) for w in m.argv[1:] for a in _alts(w)) for m in down):
            self.add("read-secret", "the environment's keys", "credential", f"{_name(c)} | grep for keys")

    def c_crontab(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        if any(w in ("-l", "-h", "--help", "-V") for w in words) and "-" not in words:
            return
        if "-r" in words:
            self.add("delete", "crontab", "system", "crontab -r")
            return
        if "-e" in words:
            return  # interactive: needs a terminal
        self.add("persist", "crontab", "system", "crontab " + " ".join(words)[:40])

    def c_at(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        if any(w in ("-l", "-r", "-d", "-c") for w in words):
            return
        self.add("persist", "at job", "system", "at")

    c_batch = c_at

    def c_systemctl(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args if not _first(w).startswith("-")]
        if not words:
            return
        verb, units = words[0], words[1:]
        if verb in ("poweroff", "reboot", "halt", "kexec", "suspend", "hibernate", "emergency", "rescue",
                    "isolate", "soft-reboot"):
            self.add("kill", "the machine", "system", "systemctl " + verb)
        elif verb in ("stop", "disable", "mask", "kill") and any(u.split(".")[0] in FIREWALLS for u in units):
            self.add("tamper", " ".join(units), "system", "systemctl " + verb)
        elif verb in ("enable", "link", "add-wants", "preset", "reenable", "edit", "set-property"):
            self.add("persist", " ".join(units) or "unit", "system", "systemctl " + verb)
        elif verb in ("stop", "kill", "mask") and any(u.split(".")[0] in ("sshd", "ssh", "systemd-journald",
                                                                       "rsyslog", "docker", "containerd") for u in units):
            self.add("kill", " ".join(units), "process", "systemctl " + verb)

    c_service = c_systemctl

    def c_launchctl(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        if words and words[0] in ("load", "bootstrap", "enable", "submit", "kickstart"):
            self.add("persist", " ".join(words[1:])[:60] or "agent", "home", "launchctl " + words[0])

    def c_kill(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        _, pos = _opts_and_args(args, frozenset({"-s", "-n"}))
        targets = [_first(w) for w in pos]
        sig_as_target = [w for w in words if re.fullmatch(r"-\d+", w)]
        # `kill -9 -1`: -1 after a signal is every process; `kill -1 PID` is SIGHUP to PID
        every = "-1" in words[1:] and (words[0].startswith("-") and words[0] != "-1" or words.count("-1") > 1) or \
            (words and words[-1] == "-1" and len(sig_as_target) >= 2)
        if every or any(t in ("1", "0", "-1") for t in targets) or (words == ["-1"]):
            self.add("kill", "every process" if every or "-1" in targets else "init", "process", "kill " + " ".join(words))

    def c_pkill(self, args: list[Word], c: Cmd, name: str = "pkill") -> None:
        words = [_first(w) for w in args]
        _, pos = _opts_and_args(args, frozenset({"-u", "-U", "-g", "-G", "-P", "-s", "-t", "--signal", "-n"}))
        pats = [_first(w) for w in pos]
        broad = any(w in ("-u", "-U", "--user", "-g", "-t") for w in words) or any(p in (".", ".*", "", "-1") for p in pats)
        vital = {"node", "init", "systemd", "sshd", "Xorg", "gnome-shell", "loginwindow", "explorer", "launchd", "dockerd",
                 "containerd", "bash", "zsh", "sh", "login", "kernel_task", "WindowServer", "Finder"}
        if broad or any(p in vital for p in pats) or (name == "killall" and "-a" in words):
            self.add("kill", " ".join(pats) or "processes", "process", name + " " + " ".join(words))


    def c_killall5(self, args: list[Word], c: Cmd) -> None:
        self.add("kill", "every process", "process", "killall5")

    def c_shutdown(self, args: list[Word], c: Cmd) -> None:
        if any(_first(w) == "-c" for w in args):
            return
        self.add("kill", "the machine", "system", "shutdown")

    c_reboot = c_poweroff = c_halt = c_shutdown

    def c_init(self, args: list[Word], c: Cmd) -> None:
        if args and _first(args[0]) in ("0", "6", "1", "S"):
            self.add("kill", "the machine", "system", "init " + _first(args[0]))

    c_telinit = c_init

    def c_ufw(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        if any(w in ("disable", "reset") for w in words) or ("default" in words and "allow" in words):
            self.add("tamper", "firewall", "system", "ufw " + " ".join(words))

    def c_iptables(self, args: list[Word], c: Cmd, name: str = "iptables") -> None:
        words = [_first(w) for w in args]
        if any(w in ("-F", "--flush", "-X", "--delete-chain", "-Z") for w in words) or (
                ("-P" in words or "--policy" in words) and "ACCEPT" in words):
            self.add("tamper", "firewall", "system", name + " " + " ".join(words))


    def c_nft(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        if "flush" in words or ("delete" in words and "table" in words):
            self.add("tamper", "firewall", "system", "nft " + " ".join(words))

    def c_setenforce(self, args: list[Word], c: Cmd) -> None:
        if args and _first(args[0]) in ("0", "Permissive", "permissive"):
            self.add("tamper", "SELinux", "system", "setenforce 0")

    def c_auditctl(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        if "-D" in words or ("-e" in words and "0" in words):
            self.add("tamper", "audit rules", "system", "auditctl")

    def c_journalctl(self, args: list[Word], c: Cmd) -> None:
        if any(_first(w).startswith(("--vacuum", "--rotate", "--flush")) for w in args):
            self.add("tamper", "the journal", "system", "journalctl " + " ".join(_first(w) for w in args))

    def c_history(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        if any(w in ("-c", "-d") or w.startswith("-c") for w in words) or (words[:1] == ["-w"] and words[1:2] == ["/dev/null"]):
            self.add("tamper", "shell history", "home", "history " + " ".join(words))

    def c_alias(self, args: list[Word], c: Cmd) -> None:
        for w in args:
            name, eq, body = _first(w).partition("=")
            if eq and body:
                self.shell_text((body,), c, f"alias {name}")  # defined to be used: judged as if it ran

    def c_unset(self, args: list[Word], c: Cmd) -> None:
        if any(_first(w) in ("HISTFILE", "HISTSIZE", "HISTFILESIZE") for w in args):
            self.add("tamper", "shell history", "home", "unset HISTFILE")

    def c_export(self, args: list[Word], c: Cmd) -> None:
        for w in args:
            a = _first(w)
            if re.match(r"^(?:HISTFILE=(?:/dev/null|$)|HISTSIZE=0|HISTFILESIZE=0)", a):
                self.add("tamper", "shell history", "home", "export " + a)
        if not args or (len(args) == 1 and _first(args[0]) == "-p"):
            self.env_dump(c)

    def c_echo(self, args: list[Word], c: Cmd) -> None:
        for w in args:
            for a in _alts(w):
                if SECRET in a:
                    var = a.split(SECRET, 1)[1].split(UNKNOWN, 1)[0]
                    self.add("read-secret", "$" + var, "credential", "echo $" + var)
                    return

    c_printf = c_echo

    def c_printenv(self, args: list[Word], c: Cmd) -> None:
        secret = [_first(w) for w in args if re.search(r"KEY|TOKEN|SECRET|PASS|CREDENTIAL", _first(w))]
        if secret and not _downstream_net(c):
            self.add("read-secret", "$" + secret[0], "credential", "printenv " + secret[0])
            return
        if not args:
            self.env_dump(c)
        elif any(SECRET in a for w in args for a in _alts(w)) or any(re.search(r"KEY|TOKEN|SECRET|PASS", _first(w))
                                                                      for w in args):
            if _downstream_net(c):
                self.add("send", _host_of(_downstream_net(c)[0]), "credential", "printenv " + _first(args[0]))

    def c_set(self, args: list[Word], c: Cmd) -> None:
        if not args:
            self.env_dump(c)

    c_declare = c_set

    def c_usermod(self, args: list[Word], c: Cmd) -> None:
        self.add("escalate", " ".join(_first(w) for w in args)[:40] or "accounts", "system", "account change")

    c_useradd = c_userdel = c_groupadd = c_groupmod = c_passwd = c_chpasswd = c_visudo = c_adduser = c_deluser = \
        c_gpasswd = c_newgrp = c_usermod

    def c_security(self, args: list[Word], c: Cmd) -> None:
        if args and _first(args[0]) in ("find-generic-password", "find-internet-password", "dump-keychain",
                                         "export", "find-certificate"):
            self.add("read-secret", "the keychain", "credential", "security " + _first(args[0]))

    def c_gpg(self, args: list[Word], c: Cmd) -> None:
        if any(_first(w).startswith(("--export-secret", "--export-ssh-key")) for w in args):
            self.add("read-secret", "gpg secret keys", "credential", "gpg --export-secret-keys")
        elif any(_first(w) in ("--delete-secret-keys", "--delete-secret-and-public-key") for w in args):
            self.add("delete", "gpg secret keys", "credential", "gpg --delete-secret-keys")

    def c_ssh_add(self, args: list[Word], c: Cmd) -> None:
        if any(_first(w) in ("-D", "-d") for w in args):
            self.add("delete", "ssh agent keys", "credential", "ssh-add -D")

    def c_ssh_keygen(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        if "-f" in words and words.index("-f") + 1 < len(words) and ("-y" in words or "-e" in words):
            self.path("read", words[words.index("-f") + 1], c.where, "ssh-keygen -y")
        elif "-f" in words and words.index("-f") + 1 < len(words):
            p = resolve(words[words.index("-f") + 1], c.where)
            if classify(p, c.where) == "credential" and "-l" not in words:
                self.add("write", display(p, c.where), "credential", "ssh-keygen -f")

    def c_git_credential(self, args: list[Word], c: Cmd) -> None:
        self.add("read-secret", "git credentials", "credential", "git credential")

    def c_mount(self, args: list[Word], c: Cmd) -> None:
        if args and not all(_first(w).startswith("-") for w in args):
            self.add("escalate", " ".join(_first(w) for w in args)[:40], "system", "mount")

    c_umount = c_mount

    def c_modprobe(self, args: list[Word], c: Cmd) -> None:
        self.add("escalate", " ".join(_first(w) for w in args)[:40] or "module", "system", "kernel module")

    c_insmod = c_rmmod = c_modprobe

    def c_sysctl(self, args: list[Word], c: Cmd) -> None:
        if any(_first(w) == "-w" or ("=" in _first(w) and not _first(w).startswith("-")) for w in args):
            self.add("write", "kernel parameters", "device", "sysctl -w")

    def c_trufflehog(self, args: list[Word], c: Cmd, name: str = "trufflehog") -> None:
        """Secret scanners pointed at home or / are a credential hunt (in the project they are hygiene)."""
        for w in args:
            for a in _alts(w):
                if a.startswith(("/", "~", ".")) or a.startswith(c.where.home):
                    p = resolve(a, c.where)
                    cls = classify(p, c.where)
                    if cls in ("home", "root", "system", "credential"):
                        self.add("read-secret", display(p, c.where), "credential", f"{name} scan of {cls}")
                        return

    def c_script(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        for i, a in enumerate(words):
            short_c = a.startswith("-") and not a.startswith("--") and a.endswith("c")
            if (a in ("-c", "--command") or short_c) and i + 1 < len(args):
                self.shell_text(args[i + 1], c, "script -c")

    def c_make(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        recipes = [a.split("=", 1)[1] for a in words if a.startswith("--eval=")]
        files = [words[i + 1] for i, a in enumerate(words[:-1]) if a in ("-f", "--file", "--makefile")]
        if c.heredoc is not None and any(f in ("-", "/dev/stdin") for f in files):
            recipes.append(c.heredoc)  # make -f /dev/stdin <<EOF: the makefile is the heredoc
        for text in recipes:
            for line in text.splitlines():
                if line.startswith("\t"):  # a recipe line runs in a shell, with $$ for $
                    self.shell_text((line[1:].replace("$$", "$"),), c, "make recipe")

    def c_claude(self, args: list[Word], c: Cmd) -> None:
        self._agent_cli("claude", args)

    def c_codex(self, args: list[Word], c: Cmd) -> None:
        self._agent_cli("codex", args)

    def _agent_cli(self, name: str, args: list[Word]) -> None:
        words = [_first(w) for w in args]
        if any(w in ("--dangerously-skip-permissions", "--dangerously-bypass-approvals-and-sandbox", "--yolo",
                     "--full-auto") or w.startswith("--permission-mode=bypass") for w in words) or (
                "--permission-mode" in words and "bypassPermissions" in words):
            flag = next(w for w in words if w.startswith("--"))
            self.add("escalate", f"{name} without its own checks", "agent-state", f"{name} {flag}")

    def c_powershell(self, args: list[Word], c: Cmd) -> None:
        self.interpreter("pwsh", args, c)
