"""Simple commands -> effects: what each command does to which target.

One table of command families (deleters, writers, readers, network clients, interpreters, wrappers,
schedulers, cloud CLIs, git, ...) reading argv the way the command does (options skipped, `--` honoured,
the destination of cp/mv, find's paths before its expression, xargs' targets from the pipe). Wrappers
(sudo, env, nohup, timeout, nice, xargs, find -exec, busybox, ...) are unwrapped, and `sh -c`, `eval`,
a heredoc or an `echo ... |` fed to a shell are parsed again, recursively. Interpreter one-liners go to
fak.core.shell.code. A command this table does not know has no effect beyond its redirects: the floor
is about known ways to do damage, and the sandbox is behind it for the rest.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace

from fak.core.shell.code import scan
from fak.core.shell.effect import SENSITIVE, Effect
from fak.core.shell.parse import DECODED, LOCAL, NET, SECRET, Cmd, Walker, Word, literal, parse
from fak.core.shell.parse import printf_text as _printf
from fak.core.shell.parse import static_decode as _static_decode
from fak.core.shell.patch import patch_effects
from fak.core.shell.targets import UNKNOWN, Where, classify, covers_all, display, is_history, is_persist, resolve

MAX_DEPTH = 6  # sh -c "sh -c '...'" nesting followed this deep; deeper is opaque

SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "mksh", "fish", "ash", "busybox-sh", "tcsh", "csh", "rbash"})
INTERPRETERS = frozenset({"python", "python2", "python3", "pypy", "pypy3", "perl", "ruby", "node", "nodejs", "deno",
                          "bun", "php", "lua", "Rscript", "osascript", "tclsh", "pwsh", "powershell", "jshell", "groovy"})
NET_CLIENTS = frozenset({"curl", "wget", "nc", "ncat", "netcat", "socat", "telnet", "ssh", "scp", "sftp", "ftp",
                         "http", "https", "xh", "aria2c", "lftp", "tftp", "rsync", "openssl", "wget2", "curlie",
                         "axel", "httpie", "gh", "s3cmd", "rclone", "mosh", "sshpass", "ncat.exe"})
DOWNLOADERS = frozenset({"curl", "wget", "fetch", "http", "https", "xh", "aria2c", "wget2", "curlie", "axel"})
DECODERS = frozenset({"base64", "base32", "basenc", "xxd", "uudecode", "rev", "openssl", "gunzip", "zcat", "tr",
                      "gzip", "bzip2", "xz", "unxz", "bunzip2", "zstd", "unzstd", "gpg"})
ENV_DUMPS = frozenset({"env", "printenv", "set", "export", "declare", "compgen"})
DELETERS = frozenset({"rm", "unlink", "rmdir", "shred", "srm", "wipe", "trash", "trash-put", "gio", "del"})
READERS = frozenset({"cat", "tac", "less", "more", "head", "tail", "nl", "strings", "xxd", "od", "hexdump", "base64",
                     "base32", "sort", "uniq", "cut", "jq", "yq", "diff", "cmp", "md5sum",
                     "sha1sum", "sha256sum", "sha512sum", "bat", "view", "vim", "vi", "nano", "emacs", "code",
                     "paste", "fold", "fmt", "iconv", "column", "tr", "pr", "expand", "look", "zcat", "zless",
                     "bzcat", "xzcat", "dos2unix",
                     "openssl", "ssh-keygen", "gpg", "zip", "7z", "pbcopy", "xclip", "xsel", "wl-copy"})
SEARCHERS = frozenset({"grep", "egrep", "fgrep", "rg", "ag", "ack", "zgrep", "git-grep"})
SECRET_PATTERN = re.compile(r"PRIVATE|BEGIN\b|AKIA|ASIA|password|passwd|secret|api[_-]?key|token|credential|"
                            r"aws_access|ghp_|sk-|xox[bp]", re.I)
METADATA_HOSTS = ("169.254.169.254", "metadata.google.internal", "100.100.100.200", "fd00:ec2::254",
                  "169.254.170.2", "metadata.azure.com", "[fd00:ec2::254]")
MAIN_BRANCHES = frozenset({"main", "master", "trunk", "production", "prod", "release", "develop"})
SQL_DESTROY = re.compile(r"\bDROP\s+(?:TABLE|DATABASE|SCHEMA|USER|ROLE|INDEX|VIEW|COLLECTION)\b|\bTRUNCATE\b"
                         r"|\bDELETE\s+FROM\s+[\w.\"`]+\s*(?:;|$)|\bFLUSH(?:ALL|DB)\b|\bdropDatabase\s*\("
                         r"|\.drop\s*\(\s*\)|\bdeleteMany\s*\(\s*\{\s*\}\s*\)|\bALTER\s+TABLE\b[^;]*\bDROP\b", re.I | re.M)
FIREWALLS = frozenset({"firewalld", "ufw", "iptables", "nftables", "apparmor", "auditd", "selinux", "fail2ban",
                       "falcon-sensor", "osqueryd", "clamav-daemon", "clamd", "crowdstrike", "wazuh-agent",
                       "sysmon", "aide", "rkhunter", "sshguard", "csf", "lfd"})


# Commands read like another (OpenTofu like Terraform, podman like docker): handled by that one, under their name
_FAMILY = {
    "gitleaks": "trufflehog", "detect-secrets": "trufflehog", "noseyparker": "trufflehog", "ggshield": "trufflehog",
    "cdk": "pulumi", "cdktf": "pulumi", "serverless": "pulumi", "sls": "pulumi", "poetry": "cargo", "uv": "cargo",
    "flit": "cargo", "hatch": "cargo", "tofu": "terraform", "terragrunt": "terraform", "oc": "kubectl",
    "podman": "docker", "nerdctl": "docker", "ip6tables": "iptables", "killall": "pkill", "ncat": "nc", "netcat": "nc",
    "telnet": "nc", **{k: "deployer" for k in ("vercel", "netlify", "firebase", "wrangler", "railway", "eb", "kamal",
                                                "surge", "amplify", "now")},
}
# The verbs that deploy, per hosting CLI (none: any run of it deploys)
_DEPLOY_VERBS: dict[str, frozenset[str]] = {
    "vercel": frozenset({"deploy", "promote", "alias"}), "now": frozenset({"deploy", "alias"}),
    "netlify": frozenset({"deploy"}), "firebase": frozenset({"deploy", "hosting:channel:deploy"}),
    "wrangler": frozenset({"deploy", "publish"}), "railway": frozenset({"up", "redeploy"}), "eb": frozenset({"deploy"}),
    "kamal": frozenset({"deploy", "redeploy", "rollback"}), "surge": frozenset(), "amplify": frozenset({"publish"}),
}
_SECRET_NAMES = re.compile(r"KEY|TOKEN|SECRET|PASS|CREDENTIAL|OPENAI|ANTHROPIC|AWS_|GITHUB|STRIPE|GH_|HF_", re.I)
_WORLD_WRITABLE = re.compile(r"(?:^|,)[ugo]*[oa][ugoa]*[+=][rxXt]*w|^=?[rx]*w[rx]*$")
_URLISH = re.compile(r"^(?:[a-z][\w+.-]*://|[\w.-]+\.\w+(?::\d+)?/|\d+\.\d+\.\d+\.\d+)")
_TAR_RUNS = ("--checkpoint-action=exec=", "--to-command=", "--use-compress-program=", "--rsh-command=", "--info-script=")
_FILTERS = frozenset({"grep", "sort", "uniq", "head", "tail", "tr", "sed", "awk", "cut", "egrep", "fgrep", "rg"})


def _first(w: Word) -> str:
    return w[0] if w else ""


def _alts(w: Word) -> tuple[str, ...]:
    return w or ("",)


def _opts_and_args(argv: list[Word], with_value: frozenset[str] = frozenset()) -> tuple[set[str], list[Word]]:
    """Short/long options (each letter of a cluster separately) and the positional words."""
    opts: set[str] = set()
    args: list[Word] = []
    it = iter(argv)
    end = False
    for w in it:
        a = _first(w)
        if end or not a.startswith("-") or a == "-":
            args.append(w)
            continue
        if a == "--":
            end = True
            continue
        if a.startswith("--"):
            name = a.split("=", 1)[0]
            opts.add(name)
            if name in with_value and "=" not in a:
                next(it, None)
            continue
        for i, ch in enumerate(a[1:]):
            opts.add("-" + ch)
            if "-" + ch in with_value:
                if i == len(a) - 2:
                    next(it, None)
                break
    return opts, args


class Judge:
    """Effects of the commands of one script (and of the scripts it runs, recursively)."""

    def __init__(self, depth: int = 0) -> None:
        self.depth = depth
        self.out: list[Effect] = []
        self.downloaded: set[str] = set()  # files written by a downloader (or a decoder) in this script
        self.written: dict[str, str] = {}  # files written with known text (echo '...' > f.sh), run later as scripts
        self.links: dict[str, str] = {}  # symlinks this script made (ln -s TARGET LINK): LINK -> TARGET

    # -- entry points -------------------------------------------------------------------------
    def script(self, text: str, where: Where, how: str = "") -> None:
        if self.depth > MAX_DEPTH:
            self.add("opaque", "nested shell", "unknown", how or "sh -c")
            return
        self.walker(parse(text, where, depth=self.depth))  # ShellParseError: the caller fails closed

    def argv(self, argv: list[str], where: Where) -> None:
        self.walker(literal(argv, where))

    def walker(self, w: Walker) -> None:
        for o in w.opaque:
            self.add("opaque", o, "unknown", "indirect expansion")
        for c in w.cmds:
            self.command(c)

    # -- helpers ------------------------------------------------------------------------------
    def add(self, kind: str, target: str, cls: str, how: str) -> None:
        self.out.append(Effect(kind, target, cls, how))

    def path(self, kind: str, raw: str, where: Where, how: str) -> None:
        """An effect on a path: classified, and a write to a persistence file is `persist`."""
        if SECRET in raw:
            self.add(kind, raw.split(SECRET, 1)[1].split(UNKNOWN, 1)[0], "credential", how)
            return
        p = self.follow(resolve(raw, where))
        cls = classify(p, where)
        shown = display(p, where)
        if kind in ("write", "delete") and cls not in ("null",):
            if is_persist(p, where) and kind == "write":
                self.add("persist", shown, cls, how)
                return
            if is_history(p, where):
                self.add("tamper", shown, cls, how)
                return
        if kind == "read":
            if cls == "credential":
                self.add("read-secret", shown, cls, how)
            return
        self.add(kind, shown, cls, how)

    def follow(self, p: str) -> str:
        """A path through the symlinks this script made: /tmp/ws/x is ~/x after `ln -s ~ /tmp/ws`."""
        for link, target in self.links.items():
            if p == link or p.startswith(link + "/"):
                return target + p[len(link):]
        return p

    def paths(self, kind: str, words: list[Word], where: Where, how: str) -> None:
        for w in words:
            for a in _alts(w):
                if a:
                    self.path(kind, a, where, how)

    def redirects(self, c: Cmd) -> None:
        for r in c.redirects:
            for t in _alts(r.target):
                if r.op in (">", ">>", ">|", "&>", "&>>", ">&") and not t.isdigit() and t != "-":
                    if t.startswith("/dev/tcp/") or t.startswith("/dev/udp/"):
                        host = t.split("/")[3] if t.count("/") >= 3 else t
                        self.add("send", host, "network", "redirect to " + t)
                        if _name(c) in SHELLS or "-i" in [_first(w) for w in c.argv]:
                            self.add("run-remote", host, "network", "a shell on a socket (reverse shell)")
                        continue
                    self.path("write", t, c.where, _name(c) + " " + r.op)
                    if _decodes(c):  # base64 -d > f: running f later runs decoded code
                        self.downloaded.add(resolve(t, c.where))
                    if _name(c) in ("echo", "printf") and len(c.argv) > 1:
                        text = " ".join(_first(w) for w in c.argv[1:] if not _first(w).startswith("-"))
                        self.written[resolve(t, c.where)] = text
                elif r.op == "<":
                    if t.startswith("/dev/tcp/") or t.startswith("/dev/udp/"):
                        host = t.split("/")[3] if t.count("/") >= 3 else t
                        self.add("run-remote" if _name(c) in SHELLS else "send", host, "network", "read from " + t)
                        continue
                    self.path("read", t, c.where, "< " + _name(c))

    # -- one command ---------------------------------------------------------------------------
    def command(self, c: Cmd) -> None:
        self.redirects(c)
        if not c.argv:
            return
        if c.dynamic_name:
            self.dynamic(c)
            return
        argv = list(c.argv)
        self.run(argv, c)

    def dynamic(self, c: Cmd) -> None:
        name = _first(c.argv[0]).replace(UNKNOWN, "$?")
        targets = [a for w in c.argv[1:] for a in _alts(w)]
        worst = "unknown"
        for t in targets:
            if t and not t.startswith("-"):
                cls = classify(resolve(t, c.where), c.where) if UNKNOWN not in t[:1] else "unknown"
                if cls in SENSITIVE:
                    worst = cls
                    self.add("opaque", display(resolve(t, c.where), c.where), cls, f"a command hidden in {name}")
                    return
        self.add("opaque", name, worst, "a command hidden in a variable")

    def run(self, argv: list[Word], c: Cmd) -> None:
        """Dispatch on the command word; wrappers unwrap and call run() again on what they run."""
        while argv:
            name = _first(argv[0]).rsplit("/", 1)[-1]
            if name.startswith("\\"):
                name = name[1:]
            args = argv[1:]
            if name in ("sudo", "doas", "pkexec", "run0", "su", "sg", "gosu", "su-exec", "chroot", "runuser"):
                probe = [_first(w) for w in args]
                if name == "sudo" and (not probe or probe in (["-n", "true"], ["-v"], ["-l"], ["-k"], ["-n", "-v"], ["-V"])
                                       or probe[:1] in (["-l"], ["-k"], ["-K"])):
                    return  # asking whether sudo works runs nothing as root
                self.add("escalate", name, "system", name)
                if name in ("su", "runuser"):
                    words = [_first(w) for w in args]
                    if "-c" in words and words.index("-c") + 1 < len(words):
                        self.shell_text(args[words.index("-c") + 1], c, name + " -c")
                    return
                argv = _skip_opts(args, {"-u", "-g", "-p", "-C", "-h", "-U", "-r", "-t", "-D", "-R", "--user",
                                         "--group"})
                if name == "chroot" and argv:
                    argv = argv[1:]
                continue
            if name == "env":
                rest = []
                skip = False
                for i, w in enumerate(args):
                    a = _first(w)
                    if skip:
                        skip = False
                        continue
                    if a in ("-u", "--unset", "-C", "--chdir"):
                        skip = True
                        continue
                    if a in ("-S", "--split-string") and i + 1 < len(args):
                        self.shell_text(args[i + 1], c, "env -S")
                        return
                    if a.startswith("-") or re.match(r"^[A-Za-z_]\w*=", a):
                        continue
                    rest = args[i:]
                    break
                if not rest:
                    self.env_dump(c)
                    return
                argv = rest
                continue
            if name in ("nohup", "time", "builtin", "exec", "setsid", "caffeinate", "unbuffer", "command", "then",
                        "do", "else", "stdbuf", "nice", "ionice", "chrt", "taskset", "timeout", "gtimeout",
                        "flock", "numactl", "cpulimit", "systemd-run", "faketime", "proxychains", "proxychains4",
                        "torsocks", "firejail", "strace", "ltrace", "catchsegv", "xvfb-run", "dbus-run-session"):
                if name == "command" and args and _first(args[0]) in ("-v", "-V"):
                    return
                argv = _skip_wrapper(name, args)
                continue
            if name in ("busybox", "toybox"):
                argv = args
                continue
            if name == "xargs":
                self.xargs(args, c)
                return
            if name == "parallel" and any(_first(w) in (":::", "::::") for w in args):
                self.parallel(args, c)
                return
            if name == "watch":
                rest = _skip_opts(args, {"-n", "--interval", "-d"})
                self.shell_text(tuple(" ".join(_first(w) for w in rest) for _ in (0,)), c, "watch")
                return
            if name == "eval":
                self.shell_text((" ".join(_first(w) for w in args),), c, "eval")
                return
            break
        if not argv:
            return
        name = _first(argv[0]).rsplit("/", 1)[-1].lstrip("\\")
        if name.lower() in NET_CLIENTS or name.lower() in SHELLS:
            name = name.lower()  # NC on a case-insensitive file system (macOS) is nc
        args = argv[1:]
        if "/" in _first(argv[0]) and resolve(_first(argv[0]), c.where) in self.written:
            self.shell_text((self.written[resolve(_first(argv[0]), c.where)],), c, "a script written here")
            return
        if "/" in _first(argv[0]) and resolve(_first(argv[0]), c.where) in self.downloaded:
            self.add("run-remote", display(resolve(_first(argv[0]), c.where), c.where), "network", "running a downloaded file")
            return
        h = getattr(self, "c_" + name.replace("-", "_").replace(".", "_"), None)
        if name in _FAMILY:
            getattr(self, "c_" + _FAMILY[name])(args, c, name)
        elif name in SHELLS:
            self.shell(name, args, c)
        elif name in INTERPRETERS or re.fullmatch(r"python\d(?:\.\d+)?|perl\d*|ruby\d*(?:\.\d+)?|php\d*|node\d*", name):
            self.interpreter(name, args, c)
        elif h is not None:
            h(args, c)
        elif name in DELETERS:
            self.delete(name, args, c)
        elif name in SEARCHERS:
            self.search(name, args, c)
        elif name in READERS:
            _, pos = _opts_and_args(args, frozenset({"-n", "-c", "-o", "-w", "-t", "-k", "-f", "-d", "-s", "-e"}))
            self.paths("read", pos, c.where, name)
        elif name.startswith("mkfs") or name in ("mke2fs", "mkswap", "wipefs", "fdisk", "sfdisk", "cfdisk", "gdisk",
                                                 "sgdisk", "parted", "blkdiscard", "mkntfs", "mkdosfs", "zpool",
                                                 "cryptsetup", "hdparm", "badblocks", "mdadm", "lvremove",
                                                 "vgremove", "pvremove", "nvme", "sg_format", "diskutil", "dmsetup"):
            self.device_tool(name, args, c)

    # -- families -----------------------------------------------------------------------------
    def shell_text(self, text: Word, c: Cmd, how: str) -> None:
        for t in _alts(text):
            if NET in t:
                self.add("run-remote", "downloaded text", "network", how + " of a download")
                continue
            if DECODED in t:
                self.add("run-remote", "decoded text", "unknown", how + " of decoded or generated text")
                continue
            if UNKNOWN in t and t.count(UNKNOWN) == t.count(UNKNOWN + LOCAL) and SECRET not in t:
                # eval "$(pyenv init -)": a local tool's own output, run as it is meant to be
                self.add("exec", t.replace(UNKNOWN + LOCAL, "$(...)")[:60], "unknown", how + " of a local tool's output")
                continue
            if UNKNOWN in t or SECRET in t:
                self.add("opaque", t.replace(UNKNOWN, "$?").replace(SECRET, "$")[:60] or "$?", "unknown",
                         how + " of text known only at run time")
                continue
            sub = Judge(self.depth + 1)
            sub.downloaded, sub.links = self.downloaded, self.links
            sub.script(t, c.where, how)
            self.out += sub.out

    def shell(self, name: str, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        for i, a in enumerate(words):
            if a.startswith("-") and not a.startswith("--") and "c" in a[1:] and i + 1 < len(words):
                self.shell_text(args[i + 1], c, f"{name} {a}")
                return
            if a.startswith("-") or a.startswith("+"):
                continue
            # sh FILE: runs a file; a downloaded one is remote code
            p = resolve(a, c.where)
            if p in self.written:
                self.shell_text((self.written[p],), c, f"{name} of a script written here")
            elif p in self.downloaded or a in self.downloaded or (a.startswith("/dev/fd/") and NET in a):
                self.add("run-remote", display(p, c.where), "network", f"{name} of a downloaded file")
            elif a.startswith("/dev/fd/") and DECODED in a:
                self.add("run-remote", "decoded text", "unknown", f"{name} of decoded or generated text")
            elif a.startswith("/dev/tcp/"):
                self.add("run-remote", a, "network", name)
            return
        interactive = "-i" in words or any(w.startswith("-") and "i" in w[1:] and not w.startswith("--") for w in words)
        self.stdin_code(name, c, interactive)

    def stdin_code(self, name: str, c: Cmd, interactive: bool = False) -> None:
        """A shell or interpreter reading its program from stdin: judge what it is fed."""
        if c.heredoc is not None and name in SHELLS:
            self.shell_text((c.heredoc,), c, f"{name} <<")
            return
        if c.heredoc is not None:
            self.code(name, c.heredoc, c)
            return
        decoded = _static_decode(c.stdin) if c.stdin is not None else None
        socket_fed = any(r.target and _first(r.target).startswith(("/dev/tcp/", "/dev/udp/"))
                         for m in c.pipeline for r in m.redirects)
        if socket_fed or (decoded is None and any(_name(m) in NET_CLIENTS for m in c.pipeline if m is not c)):
            peer = next((m for m in c.pipeline if m is not c and _name(m) in NET_CLIENTS), None)
            host = _host_of(peer) if peer is not None else "network"
            if interactive or c.stdin is None or _name(c.stdin) not in DOWNLOADERS:
                self.add("run-remote", host, "network", f"{name} wired to {_name(peer) if peer else 'a socket'} (reverse shell)")
            else:
                self.add("run-remote", host, "network", f"{_name(c.stdin)} piped into {name}")
            return
        src = c.stdin
        if src is None:
            return
        sname = _name(src)
        if decoded is not None:
            if name in SHELLS:
                self.shell_text((decoded,), c, f"{sname} -d | {name}")
            else:
                self.code(name, decoded, c)
            return
        if sname in DOWNLOADERS:
            self.add("run-remote", _host_of(src), "network", f"{sname} piped into {name}")
        elif sname in DECODERS or sname in ("python", "python3", "perl"):
            self.add("run-remote", "decoded text", "unknown", f"{sname} output run by {name}")
        elif sname in ("echo", "printf"):
            words = [_first(w) for w in src.argv[1:]]
            if sname == "echo":
                while words and re.fullmatch(r"-[neE]+", words[0]):
                    words.pop(0)
                text = " ".join(words)
            else:
                text = _printf(words)
            if name in SHELLS:
                self.shell_text((text,), src, f"{sname} | {name}")
            else:
                self.code(name, text, c)
        elif sname == "cat" and src.heredoc is not None:
            if name in SHELLS:
                self.shell_text((src.heredoc,), src, f"cat << | {name}")
            else:
                self.code(name, src.heredoc, c)
        elif name in SHELLS and sname not in ("cat",):
            self.add("opaque", f"{sname} output", "unknown", f"{sname} output run by {name}")

    def interpreter(self, name: str, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        flag = {"node": ("-e", "--eval", "-p", "--print"), "nodejs": ("-e", "--eval", "-p"), "deno": ("eval",),
                "bun": ("-e", "--eval", "-p"), "php": ("-r",), "osascript": ("-e",), "pwsh": ("-c", "-Command"),
                "powershell": ("-c", "-Command")}.get(re.sub(r"\d.*$", "", name), ("-c", "-e", "-E"))
        for i, a in enumerate(words):
            # -c CODE, or a cluster ending in it (perl -ne, python -Bc); never -MModule=x or -Idir
            hit = a in flag or (re.fullmatch(r"-[a-zA-Z0-9]*", a) is not None and not a.startswith(("-M", "-I", "-m"))
                                and any(a.endswith(f[1:]) for f in flag if f.startswith("-") and len(f) == 2))
            if hit and i + 1 < len(words):
                for code in _alts(args[i + 1]):
                    if UNKNOWN in code or SECRET in code:
                        self.add("opaque", f"{name} {a} $?", "unknown", f"{name} code known only at run time")
                    else:
                        self.out += scan(name, code, c.where, self.depth, _judge)
                perl_i = any(re.fullmatch(r"-[a-zA-Z]*i[\w.]*", w) and not w.startswith(("-M", "-I")) for w in words)
                if name.startswith("perl") and perl_i:
                    self.paths("write", [w for w in args[i + 2:] if not _first(w).startswith("-")], c.where, "perl -i")
                return
            if a == "-m" and i + 1 < len(words) and words[i + 1] == "http.server":
                self.serve(args[i + 2:], c, f"{name} -m http.server")
                return
            if a == "-m" and i + 1 < len(words):
                # python -m twine upload: the module is a command of its own
                self.run([(words[i + 1].split(".")[0],), *args[i + 2:]], c)
                return
            if a.startswith("-") and a != "-":
                continue
            if a == "-":
                if c.heredoc is None and c.stdin is None:  # the program is a file on stdin: unseen code
                    self.sensitive_args(name, args[i + 1:], c)
                break
            p = resolve(a, c.where)
            if p in self.downloaded:
                self.add("run-remote", display(p, c.where), "network", f"{name} of a downloaded file")
            return  # a script file: not judged here (the sandbox contains it)
        self.stdin_code(name, c)

    def serve(self, args: list[Word], c: Cmd, how: str) -> None:
        """A static file server: what it serves is sent to whoever asks (home serves its keys with it)."""
        words = [_first(w) for w in args]
        d = next((words[i + 1] for i, a in enumerate(words[:-1]) if a in ("--directory", "-d", "-h", "--root")), None)
        d = d or next((a.split("=", 1)[1] for a in words if a.startswith("--directory=")), None) or "."
        p = self.follow(resolve(d, c.where))
        cls = classify(p, c.where)
        if cls in ("home", "root", "credential", "system", "agent-state"):
            self.add("send", display(p, c.where), "credential", how + " of " + display(p, c.where))

    def sensitive_args(self, name: str, args: list[Word], c: Cmd) -> None:
        """Code this model cannot see, handed a sensitive path: a witness decides, not the floor."""
        for w in args:
            for a in _alts(w):
                if a and not a.startswith("-"):
                    p = resolve(a, c.where)
                    cls = classify(p, c.where)
                    if cls in SENSITIVE:
                        self.add("opaque", display(p, c.where), cls, f"{name} of unseen code given {display(p, c.where)}")
                        return

    def code(self, name: str, text: str, c: Cmd) -> None:
        self.out += scan(name, text, c.where, self.depth, _judge)

    def delete(self, name: str, args: list[Word], c: Cmd) -> None:
        if name == "gio" and (not args or _first(args[0]) not in ("trash", "remove")):
            return
        opts, pos = _opts_and_args(args[1:] if name == "gio" else args, frozenset({"-n", "-s", "--iterations", "--size"}))
        if name in ("shred", "wipe", "srm"):
            # overwriting before unlinking is for destroying evidence or data for good, not for cleaning up
            for w in pos:
                for a in _alts(w):
                    p = resolve(a, c.where)
                    cls = classify(p, c.where)
                    if cls not in ("temp", "null"):
                        self.add("tamper", display(p, c.where), cls, name)
            return
        self.paths("delete", pos, c.where, name + (" -r" if opts & {"-r", "-R", "--recursive"} else ""))

    def search(self, name: str, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        _, pos = _opts_and_args(args, frozenset({"-e", "-f", "-m", "-A", "-B", "-C", "-g", "--glob", "-t", "--type",
                                                 "--include", "--exclude", "-d", "-D", "--max-count", "--regexp"}))
        pattern = ""
        if "-e" in words and words.index("-e") + 1 < len(words):
            pattern = words[words.index("-e") + 1]
        elif pos:
            pattern, pos = _first(pos[0]), pos[1:]
        recursive = name in ("rg", "ag", "ack") or any(w in ("-r", "-R", "--recursive") or (
            w.startswith("-") and not w.startswith("--") and ("r" in w or "R" in w)) for w in words)
        for w in pos:
            for a in _alts(w):
                p = resolve(a, c.where)
                cls = classify(p, c.where)
                if cls == "credential":
                    self.add("read-secret", display(p, c.where), cls, name)
                elif recursive and SECRET_PATTERN.search(pattern) and cls in ("home", "root", "system"):
                    self.add("read-secret", display(p, c.where), "credential", f"{name} -r for secrets across {cls}")

    def xargs(self, args: list[Word], c: Cmd) -> None:
        rest = _skip_opts(args, {"-I", "-i", "-n", "-P", "-L", "-d", "-E", "-s", "-a", "--max-args", "--max-procs",
                                 "--delimiter", "--replace", "--arg-file"})
        if not rest:
            rest = [("echo",)]
        fed = _fed(c)
        ph = None
        words = [_first(w) for w in args]
        if "-I" in words and words.index("-I") + 1 < len(words):
            ph = words[words.index("-I") + 1]
        elif any(w.startswith("-I") and len(w) > 2 for w in words):
            ph = next(w[2:] for w in words if w.startswith("-I") and len(w) > 2)
        if ph is not None:
            argv = [tuple(x.replace(ph, f) for f in fed for x in _alts(w)) if any(ph in x for x in _alts(w)) else w
                    for w in rest]
        else:
            argv = [*rest, tuple(fed)]
        self.run(argv, Cmd(argv, c.where, stdin=None))

    def parallel(self, args: list[Word], c: Cmd) -> None:
        """GNU parallel CMD ::: ARGS: CMD runs once per argument ({} stands for it, else it is appended)."""
        words = [_first(w) for w in args]
        sep = next(i for i, w in enumerate(words) if w in (":::", "::::"))
        cmd = _skip_opts(args[:sep], {"-j", "--jobs", "-S", "--sshlogin", "--delay", "--timeout", "-n"})
        fed = tuple(a for w in args[sep + 1:] if _first(w) not in (":::", "::::") for a in _alts(w))
        if not cmd or not fed:
            return
        if any("{}" in _first(w) for w in cmd):
            argv = [tuple(x.replace("{}", f) for x in _alts(w) for f in fed) if "{}" in _first(w) else w for w in cmd]
        else:
            argv = [*cmd, fed]
        if len(cmd) == 1 and " " in _first(argv[0]):  # parallel 'rm -rf {}' ::: ...: one word, run by a shell
            self.shell_text(argv[0], c, "parallel")
        else:
            self.run(argv, Cmd(argv, c.where))

    def env_dump(self, c: Cmd) -> None:
        """env / printenv with no name: the environment, sent out, or filtered for its keys into the context."""
        down = _downstream(c)
        peer = next((m for m in down if _name(m) in NET_CLIENTS), None)
        if peer is not None:
            self.add("send", "the environment", "credential", f"{_name(c)} | {_name(peer)} {_host_of(peer)}")
        elif any(_name(m) in SEARCHERS and any(_SECRET_NAMES.search(a) for w in m.argv[1:] for a in _alts(w)) for m in down):
            self.add("read-secret", "the environment's keys", "credential", f"{_name(c)} | grep for keys")

    def device_tool(self, name: str, args: list[Word], c: Cmd) -> None:
        _, pos = _opts_and_args(args, frozenset({"-t", "-L", "-b", "-n", "-c"}))
        if name in ("zpool", "cryptsetup", "mdadm", "nvme", "diskutil", "dmsetup", "hdparm"):
            words = [_first(w) for w in args]
            if not any(x in words for x in ("destroy", "labelclear", "luksFormat", "erase", "--zero-superblock",
                                            "format", "eraseDisk", "remove", "--security-erase", "zeroDisk")):
                return
        devs = [w for w in pos if any(a.startswith("/dev/") for a in _alts(w))] or [("/dev/" + UNKNOWN,)]
        for w in devs:
            for a in _alts(w):
                self.add("write", a.replace(UNKNOWN, "*"), "device", name)

    # -- named commands (c_<name>) -------------------------------------------------------------
    def c_find(self, args: list[Word], c: Cmd) -> None:
        roots, under, expr = _find_parts(args)
        words = [_first(w) for w in expr]
        for j, a in enumerate(words):
            if a == "-delete":
                self.paths("delete", under, c.where, "find -delete")
            elif a in ("-exec", "-execdir", "-ok", "-okdir"):
                end = next((k for k in range(j + 1, len(words)) if words[k] in (";", "\\;", "+")), len(words))
                sub = expr[j + 1:end]
                found = tuple(x for u in under for x in _alts(u))
                argv = [tuple(x.replace("{}", f) for x in _alts(w) for f in found) if "{}" in _first(w) else w for w in sub]
                if argv:
                    self.run(argv, Cmd(argv, c.where))
            elif a in ("-fprint", "-fprintf", "-fls") and j + 1 < len(words):
                self.paths("write", [expr[j + 1]], c.where, "find " + a)

    def c_mv(self, args: list[Word], c: Cmd) -> None:
        src, dest = _sources_and_dest(args, frozenset({"-t", "--target-directory", "-S", "--suffix"}))
        self.paths("delete", src, c.where, "mv")
        self.paths("write", dest, c.where, "mv")

    def c_cp(self, args: list[Word], c: Cmd, how: str = "cp") -> None:
        src, dest = _sources_and_dest(args, frozenset({"-t", "--target-directory", "-S", "--suffix", "-m", "--mode",
                                                       "-o", "-g", "--owner", "--group"}))
        self.paths("read", src, c.where, how)
        self.paths("write", dest, c.where, how)

    def c_install(self, args: list[Word], c: Cmd) -> None:
        self.c_cp(args, c, "install")

    def c_ln(self, args: list[Word], c: Cmd) -> None:
        _, pos = _opts_and_args(args, frozenset({"-t", "-S"}))
        if len(pos) >= 2:
            self.paths("write", pos[-1:], c.where, "ln")
            if len(pos) == 2:
                link, target = resolve(_first(pos[1]), c.where).rstrip("/"), resolve(_first(pos[0]), c.where).rstrip("/")
                self.links[link] = self.follow(target)

    def c_rsync(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        for i, a in enumerate(words):
            if a in ("-e", "--rsh") and i + 1 < len(args):
                inner = _first(args[i + 1])
                if not re.fullmatch(r"ssh(?:\s+-[\w]+(?:\s+\S+)?)*", inner):
                    self.shell_text(args[i + 1], c, "rsync -e")
            elif a.startswith(("--rsh=", "--rsync-path=")):
                self.shell_text((a.split("=", 1)[1],), c, a.split("=", 1)[0])
        opts, pos = _opts_and_args(args, frozenset({"-e", "--rsh", "--exclude", "--include", "--filter", "-f",
                                                    "--password-file", "--port"}))
        remote = [w for w in pos if re.match(r"^[^/]*[\w\]]:", _first(w)) and not _first(w).startswith("/")]
        local = [w for w in pos if w not in remote]
        if any(o.startswith("--delete") or o in ("--remove-source-files",) for o in opts) and pos:
            self.paths("delete", [pos[-1]] if pos[-1] in local else [], c.where, "rsync --delete")
        if remote:
            host = _first(remote[0]).split(":", 1)[0].split("@")[-1]
            srcs = local if pos and pos[-1] in remote else []
            self.send(host, srcs, c, "rsync")
            if pos and pos[-1] in local:
                self.paths("write", [pos[-1]], c.where, "rsync")
        elif len(pos) >= 2:
            self.paths("read", pos[:-1], c.where, "rsync")
            self.paths("write", pos[-1:], c.where, "rsync")

    def c_scp(self, args: list[Word], c: Cmd) -> None:
        _, pos = _opts_and_args(args, frozenset({"-P", "-i", "-o", "-F", "-c", "-l", "-S", "-J"}))
        remote = [w for w in pos if ":" in _first(w) and not _first(w).startswith("/")]
        if remote:
            host = _first(remote[0]).split(":", 1)[0].split("@")[-1]
            srcs = [w for w in pos[:-1] if w not in remote] if pos and pos[-1] in remote else []
            self.send(host, srcs, c, "scp")
            if pos and pos[-1] not in remote:
                self.paths("write", [pos[-1]], c.where, "scp")

    c_sftp = c_scp

    def c_tee(self, args: list[Word], c: Cmd) -> None:
        _, pos = _opts_and_args(args)
        self.paths("write", pos, c.where, "tee")

    def c_touch(self, args: list[Word], c: Cmd) -> None:
        _, pos = _opts_and_args(args, frozenset({"-d", "-r", "-t", "--date", "--reference"}))
        self.paths("write", pos, c.where, "touch")

    def c_mkdir(self, args: list[Word], c: Cmd) -> None:
        _, pos = _opts_and_args(args, frozenset({"-m", "--mode"}))
        self.paths("write", pos, c.where, "mkdir")

    def c_truncate(self, args: list[Word], c: Cmd) -> None:
        _, pos = _opts_and_args(args, frozenset({"-s", "--size", "-r", "--reference"}))
        self.paths("write", pos, c.where, "truncate")

    def c_dd(self, args: list[Word], c: Cmd) -> None:
        for w in args:
            for a in _alts(w):
                if a.startswith("of="):
                    self.path("write", a[3:], c.where, "dd")
                elif a.startswith("if="):
                    self.path("read", a[3:], c.where, "dd")

    def c_sed(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        inplace = any(w == "-i" or w.startswith("-i") or w == "--in-place" or w.startswith("--in-place=")
                      or (w.startswith("-") and not w.startswith("--") and "i" in w[1:]) for w in words)
        opts, pos = _opts_and_args(args, frozenset({"-e", "-f", "--expression", "--file", "-l"}))
        has_e = "-e" in words or "--expression" in opts or "-f" in words
        files = pos if has_e else pos[1:]
        self.paths("write" if inplace else "read", files, c.where, "sed -i" if inplace else "sed")
        for w in (pos[:1] if not has_e else []) + [args[i + 1] for i, x in enumerate(words) if x == "-e" and i + 1 < len(args)]:
            m = re.search(r"(?:^|[;{}\n]|\d|/)\s*e\s+(.+?)(?:;|$)", _first(w))
            if m:
                self.shell_text((m.group(1),), c, "sed e")

    def c_perl(self, args: list[Word], c: Cmd) -> None:
        self.interpreter("perl", args, c)

    def c_awk(self, args: list[Word], c: Cmd) -> None:
        _, pos = _opts_and_args(args, frozenset({"-F", "-v", "-f"}))
        if pos:
            for prog in _alts(pos[0]):
                self.out += scan("awk", prog, c.where, self.depth, _judge)
            self.paths("read", pos[1:], c.where, "awk")

    c_gawk = c_mawk = c_nawk = c_awk

    def c_tar(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        for i, a in enumerate(words):
            for opt in _TAR_RUNS:
                if a.startswith(opt):
                    self.shell_text((a[len(opt):],), c, "tar " + opt.rstrip("="))
            if a in ("-I", "--to-command", "--use-compress-program") and i + 1 < len(args):
                self.shell_text(args[i + 1], c, "tar " + a)
        first = words[0] if words else ""
        mode = first if not first.startswith("-") else ""
        flags = "".join(w[1:] for w in words if w.startswith("-") and not w.startswith("--")) + mode
        opts, pos = _opts_and_args(args[1:] if mode else args, frozenset({"-f", "-C", "--directory", "--file", "-T",
                                                                          "-X", "--exclude"}))
        fi = next((i for i, w in enumerate(words) if w in ("-f", "--file") or (w.startswith("-") and w.endswith("f")
                                                                               and not w.startswith("--"))), None)
        archive = words[fi + 1] if fi is not None and fi + 1 < len(words) else ("" if "f" not in mode else
                                                                                 (pos[0][0] if pos else ""))
        members = [w for w in pos if _first(w) != archive]
        if "x" in flags or "--extract" in opts or "--get" in opts:
            dest = words[words.index("-C") + 1] if "-C" in words and words.index("-C") + 1 < len(words) else "."
            self.extract(dest, c, "tar -x")
        elif "c" in flags or "--create" in opts or "r" in flags:
            self.paths("read", members, c.where, "tar -c")
            if "--remove-files" in words:
                self.paths("delete", members, c.where, "tar --remove-files")
            if archive and archive != "-":
                self.path("write", archive, c.where, "tar -c")
            if archive in ("-", "") and _downstream_net(c):
                peer = _downstream_net(c)[0]
                secret = any(classify(resolve(a, c.where), c.where) in ("credential", "home")
                             for w in members for a in _alts(w))
                self.add("send", _host_of(peer), "credential" if secret else "network", f"tar | {_name(peer)}")

    def c_unzip(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        if "-d" in words and words.index("-d") + 1 < len(words):
            self.extract(words[words.index("-d") + 1], c, "unzip -d")

    def extract(self, dest: str, c: Cmd, how: str) -> None:
        """An archive unpacked into home itself can drop any startup file there (.bashrc, .ssh/authorized_keys)."""
        if self.follow(resolve(dest, c.where)).rstrip("/") == c.where.home.rstrip("/"):
            self.add("persist", "~", "home", how + " into home (its startup files)")
        else:
            self.path("write", dest, c.where, how)

    def c_chmod(self, args: list[Word], c: Cmd, how: str = "chmod") -> None:
        opts, pos = _opts_and_args([w for w in args if not re.fullmatch(r"[-+=][rwxXstugo]+", _first(w))],
                                   frozenset({"--reference"}))
        if how == "chmod":
            mode = next((a for w in args for a in _alts(w) if re.fullmatch(r"[0-7]{3,4}|[ugoa]*[-+=][rwxXst,ugoa+=-]*", a)), "")
            pos = [w for w in pos if _first(w) != mode]
            if re.fullmatch(r"[0-7]?[0-7][0-7][2367]", mode) or _WORLD_WRITABLE.search(mode):
                for w in pos:
                    for a in _alts(w):
                        p = resolve(a, c.where)
                        if classify(p, c.where) not in ("temp", "null"):
                            self.add("escalate", display(p, c.where), classify(p, c.where), f"chmod {mode} (world-writable)")
                return
            if re.fullmatch(r"[0-7]*[4-7][0-7]{3}", mode) and len(mode) == 4 or re.search(r"[ug]*\+[rwx]*s", mode):
                for w in pos:
                    for a in _alts(w):
                        self.add("escalate", display(resolve(a, c.where), c.where), "system", "chmod setuid/setgid")
                return
        elif pos:
            pos = pos[1:]  # chown OWNER FILE...
        recursive = bool(opts & {"-R", "--recursive"})
        if how == "chmod" and _tightening(mode) and not recursive and all(
                classify(p, c.where) in ("home", "project", "temp", "cache") and p.rstrip("/") != c.where.home.rstrip("/")
                for w in pos for p in (resolve(a, c.where) for a in _alts(w))):
            return  # chmod 600 ~/.ssh/config: the owner keeps access and nobody else gains any
        self.paths("chmod", pos, c.where, how + (" -R" if recursive else ""))

    def c_chown(self, args: list[Word], c: Cmd) -> None:
        self.c_chmod(args, c, "chown")

    def c_chgrp(self, args: list[Word], c: Cmd) -> None:
        self.c_chmod(args, c, "chgrp")

    def c_chattr(self, args: list[Word], c: Cmd) -> None:
        _, pos = _opts_and_args([w for w in args if not re.fullmatch(r"[-+=][aAcCdDeijPsStTu]+", _first(w))])
        self.paths("chmod", pos, c.where, "chattr")

    def c_setfacl(self, args: list[Word], c: Cmd) -> None:
        _, pos = _opts_and_args(args, frozenset({"-m", "-x", "-M", "-X", "--modify", "--remove", "--set"}))
        self.paths("chmod", pos, c.where, "setfacl")

    def c_setcap(self, args: list[Word], c: Cmd) -> None:
        self.add("escalate", " ".join(_first(w) for w in args)[:60], "system", "setcap")

    def c_curl(self, args: list[Word], c: Cmd) -> None:
        self.net_client("curl", args, c)

    def c_wget(self, args: list[Word], c: Cmd) -> None:
        self.net_client("wget", args, c)

    c_http = c_https = c_xh = c_wget2 = c_aria2c = c_curlie = c_curl

    def net_client(self, name: str, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        urls = [a for w in args for a in _alts(w) if _URLISH.match(a)]
        host = _url_host(urls[0]) if urls else "network"
        for u in urls:
            h = _url_host(u)
            if h in METADATA_HOSTS or h.startswith("169.254."):
                self.add("read-secret", h, "metadata", f"{name} of the cloud metadata endpoint")
        sent: list[str] = []
        files: set[str] = set()  # values of options that name a file to upload
        for i, a in enumerate(words):
            if a in ("-T", "--upload-file", "--post-file", "--body-file") and i + 1 < len(words):
                files.add(words[i + 1])
            elif a.startswith(("--post-file=", "--body-file=", "--upload-file=")):
                files.add(a.split("=", 1)[1])
            vals = _alts(args[i + 1]) if i + 1 < len(args) else ("",)
            if a in ("-d", "--data", "--data-binary", "--data-raw", "--data-urlencode", "-F", "--form", "--json",
                     "-T", "--upload-file", "--post-file", "--body-file", "-H", "--header", "-u", "--user",
                     "--post-data", "--body-data", "--header=", "-b", "--cookie"):
                for v in vals:
                    sent.append(v)
            elif a.startswith(("--data=", "--post-file=", "--post-data=", "--header=", "--body-file=")):
                sent.append(a.split("=", 1)[1])
            elif "=@" in a or (name in ("http", "https", "xh", "httpie") and re.match(r"^[\w-]+(?::=@|=@|@)", a)):
                sent.append(a[a.index("@"):])
            elif SECRET in a:
                sent.append(a)
        for s in sent:
            if SECRET in s:
                var = s.split(SECRET, 1)[1].split(UNKNOWN, 1)[0]
                if _own_service(var, host):
                    continue
                self.add("send", host, "credential", f"{name} with ${var}")
                return
            m = re.search(r"@([^\s;]+)", s) or (re.match(r"^([/~.][^\s;]*)$", s) if s in files else None)
            if m and m.group(1) != "-":
                p = resolve(m.group(1), c.where)
                cls = classify(p, c.where)
                if cls in ("credential", "home", "system", "project-env"):
                    self.add("send", host, "credential", f"{name} uploading {display(p, c.where)}")
                    return
        self.stdin_secret(name, host, c)  # what is piped in may be sent (-d @-, -T -, or a bare body)
        # downloads to a file, remembered for a later `sh FILE` / `chmod +x FILE && ./FILE`
        for i, a in enumerate(words):
            if a in ("-o", "--output", "-O", "--output-document") and i + 1 < len(words) and not (name == "curl" and a == "-O"):
                p = resolve(words[i + 1], c.where)
                self.downloaded.add(p)
                self.path("write", words[i + 1], c.where, f"{name} {a}")
            elif a.startswith("--output-document=") or a.startswith("--output="):
                p = resolve(a.split("=", 1)[1], c.where)
                self.downloaded.add(p)
                self.path("write", a.split("=", 1)[1], c.where, name)
            elif (name == "curl" and (a == "-O" or (a.startswith("-") and not a.startswith("--") and "O" in a))) or (
                    name == "wget" and not any(w in ("-O", "-qO-", "-O-") or w.startswith("-O") for w in words)):
                for u in urls:
                    fn = u.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
                    if fn:
                        self.downloaded.add(resolve(fn, c.where))
        if host != "network":
            self.add("send", host, "network", name)

    def stdin_secret(self, name: str, host: str, c: Cmd) -> None:
        """What is piped into a network client: the environment or a secret file means exfiltration."""
        for m in _upstream(c):
            mname = _name(m)
            if mname in ENV_DUMPS and not any(_first(w).startswith(("-", "$")) is False and mname == "export"
                                              for w in m.argv[1:]):
                if mname == "env" and len(m.argv) > 1 and not _first(m.argv[1]).startswith("-"):
                    continue
                self.add("send", host, "credential", f"{mname} | {name}")
                return
            for w in m.argv[1:]:
                for a in _alts(w):
                    if SECRET in a:
                        self.add("send", host, "credential", f"${a.split(SECRET, 1)[1].split(UNKNOWN, 1)[0]} | {name}")
                        return
                    if a.startswith("-"):
                        continue
                    if mname in READERS or mname in SEARCHERS or mname in ("tar", "zip", "gpg", "aws", "gh", "gcloud"):
                        p = resolve(a, m.where)
                        if classify(p, m.where) in ("credential", "project-env"):
                            self.add("send", host, "credential", f"{mname} {display(p, m.where)} | {name}")
                            return
            if mname in ("aws", "gh", "gcloud", "security", "az") and self._secret_cli(m):
                self.add("send", host, "credential", f"{mname} credentials | {name}")
                return
        for r in c.redirects:
            if r.op == "<":
                for t in _alts(r.target):
                    p = resolve(t, c.where)
                    if classify(p, c.where) == "credential":
                        self.add("send", host, "credential", f"{name} < {display(p, c.where)}")
                        return

    def _secret_cli(self, m: Cmd) -> bool:
        words = " ".join(_first(w) for w in m.argv[1:])
        return bool(re.search(r"export-credentials|get\s+\S*secret|auth\s+token|print-access-token|"
                              r"find-(?:generic|internet)-password|get-access-token|get-login-password", words))

    def send(self, host: str, srcs: list[Word], c: Cmd, how: str) -> None:
        for w in srcs:
            for a in _alts(w):
                p = resolve(a, c.where)
                cls = classify(p, c.where)
                if cls in ("credential", "home", "root", "project-env"):
                    self.add("send", host, "credential", f"{how} {display(p, c.where)}")
                    return
        self.add("send", host, "network", how)

    def c_nc(self, args: list[Word], c: Cmd, name: str = "nc") -> None:
        words = [_first(w) for w in args]
        host = next((w for w in words if not w.startswith("-") and not w.isdigit()), "network")
        if any(w in ("-e", "-c", "--exec", "--sh-exec", "--lua-exec") or (w.startswith("-") and not w.startswith("--")
                                                                          and ("e" in w or "c" in w)) for w in words):
            self.add("run-remote", host, "network", f"{name} -e (a shell on a socket)")
            return
        self.stdin_secret(name, host, c)
        self.add("send", host, "network", name)



    def c_socat(self, args: list[Word], c: Cmd) -> None:
        words = " ".join(_first(w) for w in args)
        m = re.search(r"(?:TCP|UDP|SSL|OPENSSL)[46]?(?:-CONNECT|-LISTEN)?:([^:,\s]+)", words, re.I)
        host = m.group(1) if m else "network"
        if re.search(r"\b(?:exec|system):", words, re.I):
            self.add("run-remote", host, "network", "socat exec (a shell on a socket)")
            return
        self.stdin_secret("socat", host, c)
        self.add("send", host, "network", "socat")


    def c_ssh(self, args: list[Word], c: Cmd) -> None:
        _, pos = _opts_and_args(args, frozenset({"-i", "-p", "-o", "-F", "-l", "-L", "-R", "-D", "-J", "-W", "-c",
                                                 "-b", "-E", "-e", "-m", "-O", "-Q", "-S", "-w", "-B"}))
        host = _first(pos[0]).split("@")[-1] if pos else "network"
        words = [_first(w) for w in args]
        if "-R" in words:
            self.add("run-remote", host, "network", "ssh -R (a tunnel into this machine)")
        for i, a in enumerate(words):
            v = words[i + 1] if i + 1 < len(words) else ""
            opt = a[2:] if a.startswith("-o") and len(a) > 2 else (v if a == "-o" else "")
            if re.match(r"(?i)(?:ProxyCommand|LocalCommand|KnownHostsCommand|PermitLocalCommand)\s*=?", opt):
                self.shell_text((re.split(r"=|\s", opt, maxsplit=1)[-1],), c, "ssh -o ProxyCommand")
        if len(pos) > 1:  # ssh joins the rest with spaces and runs it in the remote user's shell
            remote = " ".join(a for w in pos[1:] for a in _alts(w)[:1])
            self.shell_text((remote,), replace(c, where=c.where.at(c.where.home)), f"ssh {host}")
        self.stdin_secret("ssh", host, c)
        self.add("send", host, "network", "ssh")

    def c_openssl(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        if words and words[0] == "s_client":
            i = words.index("-connect") + 1 if "-connect" in words else len(words)
            host = words[i] if i < len(words) else "network"
            self.stdin_secret("openssl", host, c)
            self.add("send", host, "network", "openssl s_client")
            return
        for i, a in enumerate(words):
            if a == "-in" and i + 1 < len(words):
                self.path("read", words[i + 1], c.where, "openssl")
            if a == "-out" and i + 1 < len(words):
                self.path("write", words[i + 1], c.where, "openssl")

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

    def c_git(self, args: list[Word], c: Cmd) -> None:
        i = 0
        words = [_first(w) for w in args]
        where = c.where
        cfg: list[str] = []
        while i < len(words) and words[i].startswith("-"):
            if words[i].startswith(("--work-tree=", "--git-dir=")):
                where = where.at(resolve(words[i].split("=", 1)[1], where)) if words[i].startswith("--work-tree=") else where
                i += 1
                continue
            if words[i] in ("-C", "-c", "--git-dir", "--work-tree", "--namespace", "--exec-path") and i + 1 < len(words):
                if words[i] in ("-C", "--work-tree"):
                    where = where.at(resolve(words[i + 1], where))
                if words[i] == "-c":
                    cfg.append(words[i + 1])
                i += 2
                continue
            i += 1
        if i >= len(words):
            return
        sub, rest = words[i], words[i + 1:]
        for kv in cfg:
            key, _, val = kv.partition("=")
            key = key.lower()
            if not (val.startswith("!") or re.search(r"[;|&$`()<>]|\bsh\b|\bbash\b", val)):
                continue  # a plain value (core.pager=cat, alias.lg=log ...) runs nothing new
            if key in ("core.sshcommand", "core.fsmonitor", "core.pager", "core.editor", "core.hookspath") or \
                    key.startswith(("alias.", "credential.helper", "filter.", "diff.external")):
                self.add("opaque", f"git -c {kv}"[:60], "unknown", "a git setting that runs a command")
        if sub == "submodule" and "foreach" in rest[:2]:
            cmd = [w for w in rest[rest.index("foreach") + 1:] if not w.startswith("--")]
            if cmd:
                self.shell_text((" ".join(cmd),), c, "git submodule foreach")
        elif sub == "push":
            self.git_push(rest)
        elif sub == "config":
            self.git_config(rest, where)
        elif sub in ("filter-branch", "filter-repo"):
            self.add("history", "the repository's history", "remote", "git " + sub)
        elif sub == "reflog" and rest[:1] and rest[0] in ("expire", "delete"):
            self.add("history", "the reflog", "project-git", "git reflog " + rest[0])
        elif sub == "gc" and any(w.startswith("--prune=now") or w == "--prune=all" for w in rest):
            self.add("history", "unreachable objects", "project-git", "git gc --prune=now")
        elif sub == "update-ref" and "-d" in rest and any(_shared(_branch(w)) for w in rest):
            self.add("history", next(w for w in rest if _shared(_branch(w))), "remote", "git update-ref -d")
        elif sub == "branch" and any(w in ("-D", "-d", "--delete") or (w.startswith("-") and "D" in w) for w in rest) and \
                any(_shared(w) for w in rest):
            self.add("history", next(w for w in rest if _shared(w)), "remote", "git branch -D")
        elif sub == "clean":
            flags = "".join(w[1:] for w in rest if w.startswith("-") and not w.startswith("--"))
            if "f" in flags and "n" not in flags:
                cls = classify(where.cwd, where)  # git -C DIR clean: the untracked files of DIR's tree
                shown = ("untracked files" if cls in ("project", "project-root")
                         else "untracked files of " + display(where.cwd, c.where))
                self.add("delete", shown, "project" if cls == "project-root" else cls, "git clean")
        elif sub == "credential" and rest[:1] and rest[0] in ("fill", "get"):
            self.add("read-secret", "git credentials", "credential", "git credential " + rest[0])
        elif sub == "init" and "--template" in " ".join(rest):
            self.add("persist", "git template", "project-git", "git init --template")

    def git_push(self, rest: list[str]) -> None:
        force = any(w in ("-f", "--force", "--force-with-lease", "--force-if-includes") or w.startswith("--force")
                    or (w.startswith("-") and not w.startswith("--") and "f" in w[1:]) for w in rest)
        pos = [w for w in rest if not w.startswith("-")]
        refspecs = pos[1:] if pos else []
        if "--mirror" in rest:
            self.add("history", "every ref of " + (pos[0] if pos else "the remote"), "remote", "git push --mirror")
            return
        if ("--all" in rest or "--tags" in rest) and force:
            self.add("history", "every branch of " + (pos[0] if pos else "the remote"), "remote", "git push --force --all")
            return
        deleting = "--delete" in rest or "-d" in rest
        for r in refspecs:
            plus = r.startswith("+")
            src, _, dst = r.lstrip("+").partition(":")
            b = _branch(dst or src)
            if _shared(b) and (force or plus):
                self.add("history", b, "remote", "git push --force" if force else f"git push +{r.lstrip('+')}")
                return
            if _shared(b) and (deleting or (r.startswith(":"))):
                self.add("history", b, "remote", "git push --delete")
                return

    def git_config(self, rest: list[str], where: Where) -> None:
        pos = [w for w in rest if not w.startswith("-")]
        if not pos or any(w in ("--get", "--list", "-l", "--get-all", "--get-regexp", "--show-origin") for w in rest):
            return
        key = pos[0].lower()
        if len(pos) < 2 and "--unset" not in rest:
            return
        if key in ("core.hookspath", "core.sshcommand", "core.fsmonitor", "core.pager", "core.editor",
                   "core.askpass", "sequence.editor", "gpg.program", "core.gitproxy", "include.path",
                   "init.templatedir") or key.startswith(("credential.", "alias.", "filter.", "diff.",
                                                          "url.", "includeif.", "uploadpack.", "receive.")):
            self.add("persist", f"git config {pos[0]}", "project-git" if "--global" not in rest else "home",
                     "git config " + pos[0])

    def c_terraform(self, args: list[Word], c: Cmd, name: str = "terraform") -> None:
        words = [_first(w) for w in args]
        pos = [w for w in words if not w.startswith("-")]
        if "destroy" in pos or ("apply" in pos and ("-destroy" in words or "--destroy" in words)) or \
                (pos[:2] == ["state", "rm"]) or (pos[:1] == ["workspace"] and "delete" in pos):
            self.add("teardown", "infrastructure", "remote", name + " " + " ".join(pos[:2]))
        elif pos[:1] == ["apply"]:  # changes shared infrastructure: a person confirms, as for kubectl apply
            self.add("publish", "infrastructure", "remote", name + " apply")



    def c_pulumi(self, args: list[Word], c: Cmd, name: str = "pulumi") -> None:
        words = [_first(w) for w in args if not _first(w).startswith("-")]
        if any(w in ("destroy", "remove", "rm") for w in words) and not (name == "pulumi" and words[:1] == ["config"]):
            self.add("teardown", "stack", "remote", name + " " + " ".join(words[:2]))
        elif words[:1] == ["deploy"] and name in ("serverless", "sls", "cdk", "cdktf"):
            self.add("publish", "stack", "remote", name + " deploy")





    def c_aws(self, args: list[Word], c: Cmd) -> None:
        pos = _cli_positionals(args, frozenset({"--region", "--profile", "--output", "--endpoint-url", "--query",
                                                "--cli-read-timeout", "--ca-bundle", "--color"}))
        if len(pos) < 2:
            return
        svc, verb = pos[0], pos[1]
        words = [_first(w) for w in args]
        if (svc == "s3" and verb == "rb") or (svc == "s3" and verb == "rm" and "--recursive" in words) or \
                verb.startswith(("delete-", "terminate-", "remove-", "deregister-", "purge-", "disable-")) or \
                verb in ("schedule-key-deletion", "delete", "empty") or (svc == "s3api" and verb.startswith("delete")):
            self.add("teardown", f"aws {svc} {' '.join(pos[2:3])}".strip(), "remote", f"aws {svc} {verb}")
        elif svc == "configure" and verb in ("export-credentials", "get") and (verb == "export-credentials" or any(
                "secret" in p or "key" in p or "token" in p for p in pos[2:])):
            self.add("read-secret", "aws credentials", "credential", f"aws configure {verb}")
        elif svc in ("sts", "ecr", "codeartifact") and verb.startswith(("get-session-token", "get-login-password",
                                                                        "get-authorization-token", "assume-role")):
            if _downstream_net(c):
                self.add("send", _host_of(_downstream_net(c)[0]), "credential", f"aws {svc} {verb}")
        elif svc == "secretsmanager" and verb == "get-secret-value" or svc == "ssm" and verb == "get-parameter" and \
                "--with-decryption" in words:
            self.add("read-secret", f"aws {svc}", "credential", f"aws {svc} {verb}")
        elif svc == "s3" and verb in ("cp", "sync", "mv") and len(pos) >= 4:
            dst = pos[-1]
            if dst.startswith("s3://"):
                self.send(dst[5:].split("/")[0], [(p,) for p in pos[2:-1]], c, f"aws s3 {verb}")

    def c_gcloud(self, args: list[Word], c: Cmd) -> None:
        pos = _cli_positionals(args, frozenset({"--project", "--zone", "--region", "--format", "--account",
                                                "--configuration", "--filter"}))
        if "delete" in pos or "destroy" in pos or ("projects" in pos and "delete" in pos):
            self.add("teardown", "gcloud " + " ".join(pos[:3]), "remote", "gcloud delete")
        elif "print-access-token" in pos or "print-identity-token" in pos:
            self.add("read-secret", "gcloud token", "credential", "gcloud auth print-access-token")
        elif "deploy" in pos[:3]:
            self.add("publish", "gcloud " + " ".join(pos[:2]), "remote", "gcloud deploy")

    def c_az(self, args: list[Word], c: Cmd) -> None:
        pos = _cli_positionals(args, frozenset({"-n", "--name", "-g", "--resource-group", "--subscription", "-o",
                                                "--output", "--query"}))
        if "delete" in pos or "purge" in pos:
            self.add("teardown", "az " + " ".join(pos[:2]), "remote", "az delete")
        elif "get-access-token" in pos:
            self.add("read-secret", "az token", "credential", "az account get-access-token")

    def c_doctl(self, args: list[Word], c: Cmd) -> None:
        pos = _cli_positionals(args, frozenset({"--context", "-o", "--output"}))
        if "delete" in pos or "rm" in pos:
            self.add("teardown", "doctl " + " ".join(pos[:2]), "remote", "doctl delete")

    def c_kubectl(self, args: list[Word], c: Cmd, name: str = "kubectl") -> None:
        pos = _cli_positionals(args, frozenset({"--context", "-n", "--namespace", "--kubeconfig", "-o", "--output",
                                                "-l", "--selector", "--cluster", "--user", "-f", "--filename",
                                                "-c", "--container"}))
        words = [_first(w) for w in args]
        if pos[:2] == ["config", "view"] and ("--raw" in words or "--flatten" in words):
            self.add("read-secret", "kubeconfig tokens", "credential", f"{name} config view --raw")
            return
        if pos[:1] == ["exec"] and "--" in words:  # the command runs inside the pod: judged as it is
            inner = args[words.index("--") + 1:]
            if inner:
                self.run(inner, Cmd(inner, c.where.at("/")))
            return
        recreated = {"pod", "pods", "po", "job", "jobs", "event", "events", "ev"}
        if pos[:1] == ["delete"] and len(pos) > 1 and pos[1].split("/")[0] in recreated and "--all" not in words:
            pass  # a pod or job is recreated by its controller
        elif pos[:1] == ["delete"] or pos[:1] == ["drain"] or (pos[:1] == ["scale"] and "--replicas=0" in words):
            self.add("teardown", f"{name} {' '.join(pos[:3])}", "remote", f"{name} {pos[0]}")
        elif pos[:2] in (["get", "secret"], ["get", "secrets"]) and any(w.startswith(("-o", "--output"))
                                                                         for w in words):
            self.add("read-secret", "kubernetes secrets", "credential", f"{name} get secrets -o")
        elif pos[:1] == ["apply"] or pos[:1] == ["replace"] or pos[:1] == ["patch"]:
            if "--dry-run" not in " ".join(words):
                self.add("publish", f"{name} {pos[0]}", "remote", f"{name} {pos[0]}")


    def c_helm(self, args: list[Word], c: Cmd) -> None:
        pos = _cli_positionals(args, frozenset({"-n", "--namespace", "--kube-context", "--kubeconfig"}))
        if pos[:1] and pos[0] in ("uninstall", "delete", "del", "un"):
            self.add("teardown", "helm release " + " ".join(pos[1:2]), "remote", "helm " + pos[0])
        elif pos[:1] == ["push"]:
            self.add("publish", "helm chart", "remote", "helm push")
        elif pos[:1] and pos[0] in ("install", "upgrade", "rollback") and "--dry-run" not in " ".join(_first(w) for w in args):
            self.add("publish", "helm release " + " ".join(pos[1:2]), "remote", "helm " + pos[0])

    def c_eksctl(self, args: list[Word], c: Cmd) -> None:
        pos = _cli_positionals(args, frozenset())
        if pos[:1] == ["delete"]:
            self.add("teardown", "eks " + " ".join(pos[1:3]), "remote", "eksctl delete")

    def c_heroku(self, args: list[Word], c: Cmd) -> None:
        pos = _cli_positionals(args, frozenset({"-a", "--app"}))
        if pos[:1] and pos[0] in ("apps:destroy", "pg:reset", "destroy", "addons:destroy"):
            self.add("teardown", "heroku " + pos[0], "remote", "heroku " + pos[0])

    def c_fly(self, args: list[Word], c: Cmd) -> None:
        pos = _cli_positionals(args, frozenset({"-a", "--app"}))
        if "destroy" in pos:
            self.add("teardown", "fly app", "remote", "fly destroy")
        elif pos[:1] == ["deploy"]:
            self.add("publish", "fly app", "remote", "fly deploy")

    def c_deployer(self, args: list[Word], c: Cmd, name: str) -> None:
        """Hosting CLIs whose verb puts the project live (vercel --prod, firebase deploy, wrangler deploy ...)."""
        words = [_first(w) for w in args]
        pos = [w for w in words if not w.startswith("-")]
        verbs = _DEPLOY_VERBS[name]
        if (pos[:1] and pos[0] in verbs) or (not verbs and "--help" not in words) or (name == "vercel" and "--prod" in words):
            if "--dry-run" not in words:
                self.add("publish", f"{name} deployment", "remote", f"{name} {' '.join(pos[:1])}".strip())

    c_flyctl = c_fly

    def c_gh(self, args: list[Word], c: Cmd) -> None:
        pos = _cli_positionals(args, frozenset({"-R", "--repo", "-H", "--hostname"}))
        if pos[:2] == ["repo", "delete"]:
            self.add("teardown", "github repository", "remote", "gh repo delete")
        elif pos[:2] == ["auth", "token"] or (pos[:2] == ["auth", "status"] and "--show-token" in [_first(w) for w in args]):
            self.add("read-secret", "github token", "credential", "gh auth token")
        elif pos[:1] == ["release"] and pos[1:2] and pos[1] in ("create", "upload", "edit", "delete"):
            self.add("publish", "github release", "remote", "gh release " + pos[1])
        elif pos[:1] == ["api"] and any(_first(w) in ("-X", "--method") for w in args) and "DELETE" in [_first(w) for w in args]:
            self.add("teardown", "github api " + " ".join(pos[1:2]), "remote", "gh api -X DELETE")

    def c_docker(self, args: list[Word], c: Cmd, name: str = "docker") -> None:
        pos = _cli_positionals(args, frozenset({"-H", "--host", "--context", "--config", "-l", "--log-level"}))
        words = [_first(w) for w in args]
        if not pos:
            return
        verb = pos[0]
        if verb == "container" and len(pos) > 1:
            verb = pos[1]
        if verb in ("run", "create") or (verb == "container" and pos[1:2] == ["run"]):
            i = words.index(verb) if verb in words else 0
            opts = words[i + 1:]
            for j, a in enumerate(opts):
                v = opts[j + 1] if j + 1 < len(opts) else ""
                if a == "--privileged" or a in ("--pid=host", "--net=host", "--network=host", "--ipc=host",
                                                "--userns=host", "--uts=host") or (a in ("--pid", "--userns", "--cap-add") and
                                                                                  v in ("host", "ALL", "SYS_ADMIN")) or \
                        a.startswith("--cap-add=") and a.split("=", 1)[1] in ("ALL", "SYS_ADMIN", "SYS_PTRACE"):
                    self.add("escalate", f"{name} {a}", "system", f"{name} run {a}")
                    return
                mount = ""
                if a in ("-v", "--volume", "--mount"):
                    mount = v
                elif a.startswith(("-v", "--volume=", "--mount=")) and len(a) > 2:
                    mount = a.split("=", 1)[1] if "=" in a and not a.startswith("-v") else a[2:]
                if mount:
                    src = mount.split(":", 1)[0] if "source=" not in mount and "src=" not in mount else \
                        re.search(r"(?:source|src)=([^,]+)", mount).group(1)  # type: ignore[union-attr]
                    if src.startswith(("/", "~", ".", "$")):
                        p = resolve(src, c.where)
                        cls = classify(p, c.where)
                        if cls in ("root", "system", "home", "credential", "device") or p == "/var/run/docker.sock":
                            self.add("escalate", f"{display(p, c.where)} mounted into a container", cls,
                                     f"{name} run -v {src}")
                            return
        elif verb in ("system", "volume", "image", "builder", "network") and len(pos) > 1 and pos[1] in ("prune", "rm") \
                and (verb != "image" or "-a" in words or "--all" in words):
            if verb == "system" and not any(w in ("--all", "--volumes") or (w.startswith("-") and "a" in w and w[1:2] != "-")
                                            for w in words):
                return
            self.add("teardown", f"{name} {verb}s", "remote", f"{name} {verb} {pos[1]}")
        elif verb in ("rm", "rmi", "kill", "stop") and any("$(" in w or "`" in w or w == UNKNOWN for w in words) or \
                (verb == "rm" and any(a.startswith(UNKNOWN) for a in words)):
            self.add("teardown", f"every {name} container", "remote", f"{name} {verb} $({name} ps -aq)")
        elif verb == "push" or (verb == "image" and pos[1:2] == ["push"]) or (verb == "buildx" and "--push" in words):
            self.add("publish", f"{name} image", "remote", f"{name} push")



    def c_dropdb(self, args: list[Word], c: Cmd) -> None:
        self.add("teardown", "database", "remote", "dropdb")

    def c_psql(self, args: list[Word], c: Cmd, name: str = "psql", flags: tuple[str, ...] = ("-c", "--command")) -> None:
        words = [_first(w) for w in args]
        sql = []
        for i, a in enumerate(words):
            if a in flags and i + 1 < len(words):
                sql.append(words[i + 1])
            elif any(a.startswith(f + "=") for f in flags if f.startswith("--")):
                sql.append(a.split("=", 1)[1])
        if c.heredoc:
            sql.append(c.heredoc)
        if c.stdin is not None and _name(c.stdin) in ("echo", "printf"):
            sql.append(" ".join(_first(w) for w in c.stdin.argv[1:]))
        if c.stdin is not None and _name(c.stdin) == "cat" and c.stdin.heredoc:
            sql.append(c.stdin.heredoc)
        if name in ("sqlite3",):
            pos, skip = [], False
            for w in words:  # sqlite3's options are single-dash words, some with a value
                if skip:
                    skip = False
                elif w in ("-cmd", "-separator", "-nullvalue", "-init", "-newline"):
                    skip = True
                elif not w.startswith("-"):
                    pos.append(w)
            if pos and classify(resolve(pos[0], c.where), c.where) in ("temp", "project") or pos[:1] == [":memory:"]:
                return  # a scratch or project database file: the project's own data
            sql += pos[1:]
        if name in ("redis-cli",):
            sql.append(" ".join(w for w in words if not w.startswith("-")))
        cls = "project" if _local_scratch_db(name, words) else "remote"
        for s in sql:
            m = SQL_DESTROY.search(s)
            if m:
                self.add("teardown", m.group(0).strip()[:40], cls, f"{name} {m.group(0).split()[0]}")
                return

    def c_mysql(self, args: list[Word], c: Cmd) -> None:
        self.c_psql(args, c, "mysql", ("-e", "--execute"))

    c_mariadb = c_mysql

    def c_sqlite3(self, args: list[Word], c: Cmd) -> None:
        pos = [w for w in args if not _first(w).startswith("-")]
        self.paths("read", pos[:1], c.where, "sqlite3")
        self.c_psql(args, c, "sqlite3", ("-cmd",))

    def c_redis_cli(self, args: list[Word], c: Cmd) -> None:
        self.c_psql(args, c, "redis-cli", ())

    def c_mongo(self, args: list[Word], c: Cmd) -> None:
        self.c_psql(args, c, "mongo", ("--eval",))

    c_mongosh = c_mongo

    def c_clickhouse_client(self, args: list[Word], c: Cmd) -> None:
        self.c_psql(args, c, "clickhouse-client", ("-q", "--query"))

    def c_cqlsh(self, args: list[Word], c: Cmd) -> None:
        self.c_psql(args, c, "cqlsh", ("-e", "--execute"))

    def c_pip(self, args: list[Word], c: Cmd, name: str = "pip") -> None:
        pos = [_first(w) for w in args if not _first(w).startswith("-")]
        if pos[:2] in (["config", "set"], ["config", "edit"]) and any(re.search(r"index-url|trusted-host|find-links", p)
                                                                       for p in pos[2:3]):
            self.add("persist", "pip " + pos[2], "home", f"{name} config set (where every later install comes from)")

    c_pip3 = c_pip

    def c_npm(self, args: list[Word], c: Cmd, name: str = "npm") -> None:
        pos = [_first(w) for w in args if not _first(w).startswith("-")]
        if pos[:2] == ["config", "set"] and any(p.split("=")[0].endswith("registry") for p in pos[2:3]):
            self.add("persist", "npm registry", "home", f"{name} config set registry (where every later install comes from)")
        if pos[:2] == ["pkg", "set"] and any(p.startswith("scripts.") for p in pos[2:]):
            pkg = resolve("package.json", c.where)
            if classify(pkg, c.where) not in ("project", "temp"):  # a lifecycle script another repo will run
                self.add("persist", display(pkg, c.where), classify(pkg, c.where), f"{name} pkg set scripts")
        if pos[:1] and pos[0] in ("publish", "unpublish", "deprecate") or pos[:2] in (["dist-tag", "add"], ["dist-tag", "rm"],
                                                                                      ["owner", "add"], ["owner", "rm"]):
            if "--dry-run" not in [_first(w) for w in args]:
                self.add("publish", f"{name} package", "remote", f"{name} {pos[0]}")

    c_yarn = c_pnpm = c_npm

    def c_twine(self, args: list[Word], c: Cmd) -> None:
        if args and _first(args[0]) == "upload":
            self.add("publish", "python package", "remote", "twine upload")

    def c_cargo(self, args: list[Word], c: Cmd, name: str = "cargo") -> None:
        pos = [_first(w) for w in args if not _first(w).startswith("-")]
        if "publish" in pos[:2] and "--dry-run" not in [_first(w) for w in args]:
            self.add("publish", f"{name} package", "remote", f"{name} publish")





    def c_gem(self, args: list[Word], c: Cmd) -> None:
        if args and _first(args[0]) in ("push", "yank"):
            self.add("publish", "gem", "remote", "gem " + _first(args[0]))

    def c_mvn(self, args: list[Word], c: Cmd) -> None:
        if any(_first(w) in ("deploy", "release:perform") for w in args):
            self.add("publish", "maven artifact", "remote", "mvn deploy")

    def c_gradle(self, args: list[Word], c: Cmd) -> None:
        if any(_first(w).startswith("publish") for w in args):
            self.add("publish", "gradle publication", "remote", "gradle publish")

    c_gradlew = c_gradle

    def c_dotnet(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        if words[:2] == ["nuget", "push"]:
            self.add("publish", "nuget package", "remote", "dotnet nuget push")

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

    def c_source(self, args: list[Word], c: Cmd) -> None:
        if args:
            self.shell("source", [w for w in args[:1]], c)

    c__ = c_source

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

    def c_apply_patch(self, args: list[Word], c: Cmd) -> None:
        body = c.heredoc or (_first(args[0]) if args else "")
        self.out += patch_effects(body, c.where, "apply_patch")

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

    def c_npx(self, args: list[Word], c: Cmd) -> None:
        rest = _skip_opts(args, {"-p", "--package", "-c", "--call"})
        if rest:
            self.run([(_first(rest[0]).split("@")[0] if not _first(rest[0]).startswith("@") else _first(rest[0]),), *rest[1:]], c)

    c_pnpx = c_bunx = c_npx

    def c_rimraf(self, args: list[Word], c: Cmd) -> None:
        self.delete("rm", [("-r",), *args], c)

    def c_vim(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        for i, a in enumerate(words):
            cmd = words[i + 1] if a in ("-c", "--cmd") and i + 1 < len(words) else (a[1:] if a.startswith("+") else "")
            m = re.match(r"^:?\s*!(.*)", cmd)
            if m:
                self.shell_text((m.group(1),), c, "vim :!")
        _, pos = _opts_and_args(args, frozenset({"-c", "--cmd", "-u", "-S"}))
        self.paths("read", [w for w in pos if not _first(w).startswith("+")], c.where, "vim")

    c_vi = c_nvim = c_ex = c_vim

    def c_zip(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        for i, a in enumerate(words):
            if a in ("-TT", "--unzip-command") and i + 1 < len(args):
                self.shell_text(args[i + 1], c, "zip -TT")
        _, pos = _opts_and_args(args, frozenset({"-P", "-x", "-i", "-TT", "--unzip-command"}))
        self.paths("read", pos[1:], c.where, "zip")
        self.paths("write", pos[:1], c.where, "zip")

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

    def c_ztcp(self, args: list[Word], c: Cmd) -> None:
        self.add("run-remote", _first(args[0]) if args else "network", "network", "zsh ztcp (a socket in the shell)")

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


# A token sent to the service that issued it is how it is used, not a leak.
_TOKEN_HOSTS = {"GITHUB": ("github.com", "githubusercontent.com"), "GH": ("github.com",), "GITLAB": ("gitlab.com",),
                "OPENAI": ("openai.com",), "ANTHROPIC": ("anthropic.com",), "CLAUDE": ("anthropic.com",),
                "HF": ("huggingface.co",), "HUGGINGFACE": ("huggingface.co",), "NPM": ("npmjs.org", "npmjs.com"),
                "PYPI": ("pypi.org",), "AWS": ("amazonaws.com",), "SLACK": ("slack.com",), "STRIPE": ("stripe.com",),
                "SENTRY": ("sentry.io",), "VERCEL": ("vercel.com",), "CLOUDFLARE": ("cloudflare.com",),
                "DIGITALOCEAN": ("digitalocean.com",), "DOCKER": ("docker.io", "docker.com"), "CODECOV": ("codecov.io",)}


def _own_service(var: str, host: str) -> bool:
    prefix = var.split("_", 1)[0].upper()
    return any(host == h or host.endswith("." + h) for h in _TOKEN_HOSTS.get(prefix, ()))


def _sources_and_dest(args: list[Word], with_value: frozenset[str]) -> tuple[list[Word], list[Word]]:
    """cp/mv/install: what is read or moved, and where it goes (the last word, or -t DIR)."""
    _, pos = _opts_and_args(args, with_value)
    words = [_first(w) for w in args]
    if "-t" in words:
        i = words.index("-t") + 1
        return pos, [args[i]] if i < len(args) else []
    return pos[:-1], pos[-1:]


def _tightening(mode: str) -> bool:
    """A mode that keeps the owner's read (and write, if it is octal) and gives group and others no write."""
    m = re.fullmatch(r"0?([67])([0-7])([0-7])", mode)
    if m:
        return not (int(m.group(2)) & 2 or int(m.group(3)) & 2)
    return re.fullmatch(r"(?:go|og|g|o)-[rwx]+", mode) is not None


def _local_scratch_db(name: str, words: list[str]) -> bool:
    """A database client pointed at this machine and at a test/dev database (or a redis db other than 0):
    the project's own scratch data, which its tests reset all the time."""
    host, db = "localhost", ""
    for i, w in enumerate(words):
        v = words[i + 1] if i + 1 < len(words) else ""
        if w in ("-h", "--host"):
            host = v
        elif w.startswith("--host="):
            host = w.split("=", 1)[1]
        elif w in ("-d", "--dbname", "-D", "--database", "-n"):
            db = v
        elif w.startswith(("--dbname=", "--database=")):
            db = w.split("=", 1)[1]
        elif w.startswith(("postgres://", "postgresql://", "mysql://", "redis://")):
            host = _url_host(w)
            db = w.rsplit("/", 1)[-1] if w.count("/") > 2 else ""
    if host not in ("localhost", "127.0.0.1", "::1", "") and not host.startswith("/"):
        return False
    if name == "redis-cli":
        return db.isdigit() and db != "0"
    return re.search(r"(?:^|[_-])(?:test|tests|testing|dev|ci|local|scratch)(?:$|[_-]\w*)", db) is not None


def _judge(cmd: str | list[str], where: Where, depth: int) -> list[Effect]:
    """Shell text or an argv found inside interpreter code, judged at `depth` (code.scan calls back here)."""
    j = Judge(depth)
    if isinstance(cmd, list):
        j.argv(cmd, where)
    else:
        j.script(cmd, where, "code")
    return j.out


def _name(c: Cmd | None) -> str:
    if c is None or not c.argv:
        return ""
    argv = c.argv
    i = 0
    while i < len(argv) - 1 and _first(argv[i]).rsplit("/", 1)[-1] in ("sudo", "env", "nohup", "time", "command",
                                                                       "exec", "stdbuf", "nice", "doas"):
        i += 1
        while i < len(argv) - 1 and (_first(argv[i]).startswith("-") or "=" in _first(argv[i])):
            i += 1
    name = _first(argv[i]).rsplit("/", 1)[-1].lstrip("\\")
    return name.lower() if name.lower() in NET_CLIENTS or name.lower() in SHELLS else name


def _upstream(c: Cmd) -> Iterator[Cmd]:
    seen = 0
    s = c.stdin
    while s is not None and seen < 16:
        yield s
        s = s.stdin
        seen += 1
    for m in c.pipeline:  # tee and fifos make a pipeline a loop; anything in it may feed the client
        if m is not c and m not in list(_chain(c)):
            yield m


def _chain(c: Cmd) -> Iterator[Cmd]:
    s = c.stdin
    n = 0
    while s is not None and n < 16:
        yield s
        s = s.stdin
        n += 1


def _downstream(c: Cmd) -> list[Cmd]:
    out = []
    s = c.stdout
    while s is not None and len(out) < 16:
        out.append(s)
        s = s.stdout
    return out


def _downstream_net(c: Cmd) -> list[Cmd]:
    return [m for m in _downstream(c) if _name(m) in NET_CLIENTS]


def _host_of(c: Cmd | None) -> str:
    if c is None:
        return "network"
    for w in c.argv[1:]:
        for a in _alts(w):
            if "://" in a:
                return _url_host(a)
    for w in c.argv[1:]:
        for a in _alts(w):
            if not a.startswith("-") and re.match(r"^[\w.-]+\.[a-z]{2,}|^\d+\.\d+\.\d+\.\d+|^localhost$|^[\w-]+@", a):
                return a.split("@")[-1].split(":")[0].split("/")[0]
    return "network"


def _url_host(u: str) -> str:
    rest = u.split("://", 1)[-1]
    host = rest.split("/", 1)[0].split("@")[-1]
    if host.startswith("["):
        return host.split("]")[0] + "]"
    return host.split(":")[0]


def _branch(ref: str) -> str:
    r = ref.lstrip("+")
    for p in ("refs/heads/", "heads/", "origin/", "refs/remotes/origin/"):
        if r.startswith(p):
            r = r[len(p):]
    return r


def _shared(branch: str) -> bool:
    """A branch others build on: main, master, ..., and the families under them (release/2.x)."""
    return branch in MAIN_BRANCHES or branch.split("/", 1)[0] in MAIN_BRANCHES


def _fed(c: Cmd) -> list[str]:
    """What a command reads on stdin, as targets: find/ls roots, echo's words, else UNKNOWN."""
    src = c.stdin
    if src is None:
        return [UNKNOWN]
    n = _name(src)
    while n in _FILTERS and src.stdin is not None:
        src = src.stdin
        n = _name(src)
    words = [a for w in src.argv[1:] for a in _alts(w)]
    if n == "find":
        _, under, _ = _find_parts(src.argv[1:])
        return [a for u in under for a in _alts(u)]
    if n in ("ls", "fd", "fdfind"):
        roots = [a for a in words if not a.startswith("-")] or ["."]
        return [r.rstrip("/") + "/" + UNKNOWN for r in roots]
    if n in ("echo", "printf"):
        ws = [a for a in words if not re.fullmatch(r"-[neE]+", a)]
        out = []
        for a in ws:
            out += a.split()
        return out or [UNKNOWN]
    if n == "git" and words[:1] in (["ls-files"], ["diff"]):
        spec = [w for w in words[1:] if not w.startswith("-")]
        narrowed = any(not covers_all(w) for w in spec) or any(w in ("-o", "--others", "-m", "--modified", "-d", "--deleted",
                                                                     "--name-only", "-u", "--unmerged") for w in words)
        return [src.where.cwd + "/" + ("*(selected)" if narrowed else UNKNOWN)]
    return [UNKNOWN]


_FIND_NARROW = frozenset({"-name", "-iname", "-path", "-ipath", "-wholename", "-iwholename", "-regex", "-iregex",
                          "-newer", "-mtime", "-mmin", "-atime", "-amin", "-ctime", "-cmin", "-size", "-empty",
                          "-user", "-group", "-perm", "-links", "-inum", "-samefile", "-lname", "-ilname"})


def _decodes(c: Cmd) -> bool:
    """A command that prints decoded bytes: base64 -d, xxd -r, openssl base64 -d, uudecode, gunzip of them."""
    flags = [_first(w) for w in c.argv[1:]]
    n = _name(c)
    return (n in ("base64", "base32", "basenc") and any(f in ("-d", "--decode", "-D") for f in flags)) or \
        (n == "xxd" and "-r" in flags) or (n == "openssl" and "-d" in flags) or n == "uudecode"


def _find_parts(args: list[Word]) -> tuple[list[Word], list[Word], list[Word]]:
    """find's roots, what it selects under them, and its expression. A name test narrows the selection
    to that pattern (find . -name '*.pyc' is not the whole project); without one every entry is chosen."""
    i = 0
    while i < len(args) and (_first(args[i]) in ("-H", "-L", "-P") or _first(args[i]).startswith("-O")):
        i += 1
    roots: list[Word] = []
    while i < len(args) and not _first(args[i]).startswith(("-", "(", "!", "\\(")):
        roots.append(args[i])
        i += 1
    roots = roots or [(".",)]
    expr = args[i:]
    words = [_first(w) for w in expr]
    name = next((words[k + 1] for k, w in enumerate(words) if w in ("-name", "-iname") and k + 1 < len(words)), None)
    narrowed = name is not None or any(w in _FIND_NARROW for w in words) or "-prune" in words
    if name is not None and (not any(ch in name for ch in "*?[") or not covers_all(name)):
        sel = name
    elif narrowed:
        sel = "*(selected)"  # some entries: the class of the root, not the whole of it
    else:
        sel = ""
    under = [tuple((a.rstrip("/") + "/" + sel) if sel else a for a in _alts(r)) for r in roots]
    return roots, under, expr


def _skip_opts(args: list[Word], with_value: set[str]) -> list[Word]:
    i = 0
    while i < len(args):
        a = _first(args[i])
        if a == "--":
            return args[i + 1:]
        if not a.startswith("-") or a == "-":
            break
        if a in with_value or (a.startswith("--") and a.split("=", 1)[0] in with_value and "=" not in a):
            i += 2
            continue
        i += 1
    return args[i:]


def _skip_wrapper(name: str, args: list[Word]) -> list[Word]:
    value_opts = {"nice": {"-n", "--adjustment"}, "ionice": {"-c", "-n", "-p", "--class", "--classdata"},
                  "stdbuf": {"-i", "-o", "-e"}, "timeout": {"-s", "--signal", "-k", "--kill-after"},
                  "chrt": {"-p"}, "taskset": {"-p"}, "exec": {"-a"}, "numactl": {"-C", "-N", "-m", "--cpunodebind",
                                                                                 "--membind"},
                  "cpulimit": {"-l", "--limit", "-p"}, "systemd-run": {"-p", "--unit", "--property", "-u"},
                  "strace": {"-o", "-e", "-p", "-s"}, "ltrace": {"-o", "-e", "-p"}, "firejail": set()}.get(name, set())
    rest = _skip_opts(args, value_opts)
    if name in ("timeout", "gtimeout") and rest:
        rest = rest[1:]  # the duration
    if name in ("chrt", "taskset") and rest:
        rest = rest[1:]  # priority / cpu mask
    if name == "flock" and rest:
        rest = rest[1:]  # the lock file
        if rest and _first(rest[0]) in ("-c", "--command") and len(rest) > 1:
            return [("sh",), ("-c",), rest[1]]
    if name == "faketime" and rest:
        rest = rest[1:]
    return rest


def _cli_positionals(args: list[Word], with_value: frozenset[str]) -> list[str]:
    out: list[str] = []
    words = [_first(w) for w in args]
    i = 0
    while i < len(words):
        a = words[i]
        if a.startswith("-"):
            if "=" in a:
                i += 1
                continue
            # an option followed by a value: known ones, or any --long followed by a non-option when
            # the CLI (aws, gcloud) takes values between the verb and the target
            if a in with_value or (a.startswith("--") and i + 1 < len(words) and not words[i + 1].startswith("-")
                                   and a not in ("--recursive", "--force", "--yes", "--all", "--quiet", "--dry-run",
                                                 "--no-wait", "--purge", "--permanent", "--wait", "-y", "-f", "-q")):
                i += 2
                continue
            i += 1
            continue
        out.append(a)
        i += 1
    return out
