"""Simple commands -> effects: what each command does to which target.

The Judge walks a script's commands and dispatches each on its name to a handler (`c_<name>`) that reads
argv the way the command does (options skipped, `--` honoured, the destination of cp/mv, find's paths
before its expression, xargs' targets from the pipe). The handlers live by family: files.py (deleters,
writers, archives, permissions), net.py (network clients), system.py (the machine and the session),
remote.py (git, cloud, clusters, databases, registries); argv.py reads words and pipelines. Wrappers
(sudo, env, nohup, timeout, nice, xargs, find -exec, busybox, ...) are unwrapped, and `sh -c`, `eval`,
a heredoc or an `echo ... |` fed to a shell are parsed again, recursively. Interpreter one-liners go to
fak.core.shell.code. A command this table does not know has no effect beyond its redirects: the floor
is about known ways to do damage, and the sandbox is behind it for the rest.
"""

from __future__ import annotations

import re

from fak.core.shell.argv import (
    _FAMILY,
    DECODERS,
    DELETERS,
    DOWNLOADERS,
    INTERPRETERS,
    MAX_DEPTH,
    NET_CLIENTS,
    READERS,
    SEARCHERS,
    SHELLS,
    _alts,
    _decodes,
    _first,
    _host_of,
    _name,
    _opts_and_args,
    _skip_opts,
    _skip_wrapper,
)
from fak.core.shell.code import scan
from fak.core.shell.effect import SENSITIVE, Effect
from fak.core.shell.files import FileCommands
from fak.core.shell.net import NetCommands
from fak.core.shell.parse import DECODED, LOCAL, NET, SECRET, Cmd, Walker, Word, literal, parse
from fak.core.shell.parse import printf_text as _printf
from fak.core.shell.parse import static_decode as _static_decode
from fak.core.shell.remote import RemoteCommands
from fak.core.shell.simple import simple
from fak.core.shell.system import SystemCommands
from fak.core.shell.targets import UNKNOWN, Where, classify, display, is_history, is_persist, resolve


class Judge(FileCommands, NetCommands, SystemCommands, RemoteCommands):
    """Effects of the commands of one script (and of the scripts it runs, recursively)."""

    def __init__(self, depth: int = 0) -> None:
        self.depth = depth
        self.out: list[Effect] = []
        self.downloaded: set[str] = set()  # files written by a downloader (or a decoder) in this script
        self.written: dict[str, str] = {}  # files written with known text (echo '...' > f.sh), run later as scripts
        self.links: dict[str, str] = {}  # symlinks this script made (ln -s TARGET LINK): LINK -> TARGET

    def script(self, text: str, where: Where, how: str = "") -> None:
        if self.depth > MAX_DEPTH:
            self.add("opaque", "nested shell", "unknown", how or "sh -c")
            return
        fast = simple(text, where)  # the common shapes without tree-sitter; None: the parser decides
        self.walker(fast if fast is not None else parse(text, where, depth=self.depth))  # ShellParseError: fail closed

    def argv(self, argv: list[str], where: Where) -> None:
        self.walker(literal(argv, where))

    def walker(self, w: Walker) -> None:
        for o in w.opaque:
            self.add("opaque", o, "unknown", "indirect expansion")
        for c in w.cmds:
            self.command(c)

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


def _judge(cmd: str | list[str], where: Where, depth: int) -> list[Effect]:
    """Shell text or an argv found inside interpreter code, judged at `depth` (code.scan calls back here)."""
    j = Judge(depth)
    if isinstance(cmd, list):
        j.argv(cmd, where)
    else:
        j.script(cmd, where, "code")
    return j.out
