"""Commands that delete, write, move, archive or change the permissions of files (rm, find, cp, mv, rsync, tar,
chmod, sed -i, dd ...), and the wrappers that feed them targets (xargs, parallel)."""

from __future__ import annotations

import re

from fak.core.shell.argv import (
    _TAR_RUNS,
    _WORLD_WRITABLE,
    SECRET_PATTERN,
    _alts,
    _downstream_net,
    _fed,
    _find_parts,
    _first,
    _host_of,
    _name,
    _opts_and_args,
    _skip_opts,
    _sources_and_dest,
    _tightening,
)
from fak.core.shell.parse import Cmd, Word
from fak.core.shell.patch import patch_effects
from fak.core.shell.targets import UNKNOWN, classify, display, resolve


class FileCommands:
    """A family of Judge's command handlers (c_<name>), mixed into fak.core.shell.commands.Judge."""


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
                self.code("awk", prog, c)
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

    def c_source(self, args: list[Word], c: Cmd) -> None:
        if args:
            self.shell("source", [w for w in args[:1]], c)

    c__ = c_source

    def c_apply_patch(self, args: list[Word], c: Cmd) -> None:
        body = c.heredoc or (_first(args[0]) if args else "")
        self.out += patch_effects(body, c.where, "apply_patch")

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
