"""The bubblewrap command line for one sandbox, built from a typed SandboxSpec.

What a sandboxed process gets (the shape of Claude Code's bubblewrap sandbox and Codex's Landlock one):
the whole file system read-only, the project read-write, the agent's own state read-write, every
credential store that exists hidden (an empty read-only tmpfs over a directory, /dev/null over a file),
a private /tmp, new pid / network / ipc namespaces (no network at all: only loopback, where
fak/sandbox/relay.py forwards named ports to unix sockets bound in from outside), no capabilities, and
--die-with-parent: when the guard or the tool that started it goes, everything inside goes too.

`contain()` reads the file system (which credential stores exist, what lies under /tmp) and returns the
spec; `bwrap_argv()` is a pure function of the spec.
"""

from __future__ import annotations

import atexit
import functools
import os
import pwd
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fak.errors import FakError

INSTALL_HINT = "apt-get install bubblewrap"
RELAY = Path(__file__).resolve().with_name("relay.py")
# credential stores, relative to a home: what a command the model wrote must not read (the policy judges
# intent; this is the floor under it when the policy misses)
CREDENTIALS: tuple[str, ...] = (
    ".ssh", ".gnupg", ".aws", ".azure", ".config/gcloud", ".oci", ".config/doctl", ".kube", ".docker",
    ".netrc", ".git-credentials", ".password-store", ".config/gh", ".config/hub", ".config/git/credentials",
    ".terraform.d", ".vault-token", ".npmrc", ".yarnrc.yml", ".pypirc", ".gem/credentials",
    ".cargo/credentials", ".cargo/credentials.toml", ".config/rclone", ".s3cfg", ".boto", ".pgpass",
    ".my.cnf", ".local/share/keyrings", ".config/op", ".mozilla", ".config/google-chrome", ".config/chromium",
    ".codex/auth.json", ".claude/.credentials.json", ".config/github-copilot",
)
PRIVATE_TMP = (Path("/tmp"), Path("/var/tmp"))


@dataclass(frozen=True)
class Relay:
    """127.0.0.1:`port` inside the sandbox, relayed to the unix socket `socket` outside it."""

    name: str  # "gateway" | "proxy": what the banner calls it
    port: int
    socket: Path


@dataclass(frozen=True)
class SandboxSpec:
    project: Path  # read-write, and the working directory
    home: Path  # $HOME inside (unchanged: the agent's own state is found where it always is)
    writable: tuple[Path, ...] = ()  # the agent's own state (existing paths), read-write
    readonly: tuple[Path, ...] = ()  # inside the writable ones but not the agent's to change (the guard's journal)
    hidden: tuple[Path, ...] = ()  # existing credential stores, masked
    hidden_files: frozenset[Path] = frozenset()  # which of `hidden` are files (masked by an empty file)
    empty: Path = Path("/dev/null")  # a read-only empty regular file outside (bwrap binds are nodev: not /dev/null)
    visible: tuple[Path, ...] = ()  # read-only paths under a private tmp that must stay visible (HOME, python)
    tmpdir: Path | None = None  # $TMPDIR when it is under /tmp: made again, empty, inside the private /tmp
    relays: tuple[Relay, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # set inside (proxy variables)
    new_session: bool = True  # setsid: no controlling terminal (off for an interactive agent, see seccomp.py)
    python: str = sys.executable  # runs the relay (pid 1 when there are relays)

    @property
    def sockets(self) -> tuple[Path, ...]:
        return tuple(sorted({r.socket.parent for r in self.relays}))

    def describe(self) -> dict[str, object]:
        """What the sandbox allows and refuses, for the banner and the summary."""
        return {"rw": [str(p) for p in (self.project, *self.writable)], "hidden": [str(p) for p in self.hidden],
                "net": [r.name for r in self.relays], "tmp": "private", "tmp_shown": [str(p) for p in self.visible]}


@functools.cache
def empty_file() -> Path:
    """One empty read-only file per process (removed at exit): what a credential file is masked with."""
    fd, name = tempfile.mkstemp(prefix="fak-sandbox-empty-")
    os.close(fd)
    os.chmod(name, 0o444)
    atexit.register(lambda: os.path.exists(name) and os.unlink(name))
    return Path(name)


def find_bwrap() -> str | None:
    return shutil.which("bwrap")


def require_bwrap(who: str) -> str:
    """bwrap's path, or the one line saying how to get it."""
    exe = find_bwrap()
    if exe is None:
        raise FakError(f"{who}: bubblewrap (bwrap) is not installed; install it ({INSTALL_HINT}) or pass --sandbox off")
    return exe


def _real(p: str | os.PathLike[str]) -> Path:
    return Path(os.path.realpath(p))


def _under(p: Path, roots: tuple[Path, ...] | list[Path]) -> bool:
    return any(p == r or r in p.parents for r in roots)


def user_homes(home: Path | None = None) -> tuple[Path, ...]:
    """`home`, this process's $HOME and the user's home from the password database (a HOME pointed
    elsewhere must not leave the real one's keys in view)."""
    out = [_real(home)] if home is not None else []
    out.append(_real(os.path.expanduser("~")))
    try:
        out.append(_real(pwd.getpwuid(os.getuid()).pw_dir))
    except KeyError:
        pass
    return tuple(dict.fromkeys(out))


def check_project(project: str | os.PathLike[str], who: str) -> None:
    """The project is what the sandbox leaves writable: not / and not the user's whole home."""
    proj = _real(project)
    if proj == Path("/") or proj in user_homes():
        where = "/" if proj == Path("/") else "your home directory"
        raise FakError(f"{who}: the project directory is {where}: the sandbox would leave all of it writable; "
                       "run from a project directory, or pass --sandbox off")


def program_roots(argv: tuple[str, ...] | list[str], path: str | None = None) -> list[Path]:
    """What a private /tmp must leave in view for `argv` to run: its command (found on `path`) and its
    script (the first argument that is not an option, when it names a file: `python agent.py`, `node
    cli.js`). When either, or the file a link of it names, lies under /tmp: the entry of /tmp holding it,
    read-only. The whole entry and not the file, because a program is rarely one file (a script's package
    beside it, an npm package's dependencies in its node_modules). Later arguments are data, not the
    program: a file named there stays hidden."""
    files: list[str] = []
    if argv:
        cmd = shutil.which(argv[0], path=path) if os.sep not in argv[0] else argv[0]
        files.append(cmd or "")
        script = next((a for a in argv[1:] if not a.startswith("-")), "")
        files.append(script)
    out: list[Path] = []
    for f in files:
        if not f or not os.path.isfile(f):
            continue
        for p in (Path(os.path.abspath(f)), _real(f)):
            for t in PRIVATE_TMP:
                if t in p.parents:
                    out.append(t / p.relative_to(t).parts[0])
    return list(dict.fromkeys(out))


def contain(project: str | os.PathLike[str], home: str | os.PathLike[str], *, writable: tuple[Path, ...] = (),
            readonly: tuple[Path, ...] = (), relays: tuple[Relay, ...] = (), env: dict[str, str] | None = None,
            tmpdir: str | None = None, interactive: bool = False, programs: tuple[str, ...] = (),
            path: str | None = None, who: str = "fak") -> SandboxSpec:
    """The spec for a sandbox around `project` with $HOME `home`: the credential stores that exist
    under either home found, the paths under /tmp that must stay visible collected (among them what
    runs the agent: `programs`, its argv, looked up on `path`)."""
    check_project(project, who)
    proj, hm = _real(project), _real(home)
    homes = user_homes(hm)
    rw = tuple(dict.fromkeys(_real(p) for p in writable if os.path.lexists(p)))
    hidden: list[Path] = []
    files: set[Path] = set()
    for h in homes:
        for rel in CREDENTIALS:
            p = h / rel
            if not p.exists():  # follows a symlink: a store linked elsewhere is masked where it lives
                continue
            real = _real(p)
            # the running agent's own token stays with it (~/.claude/.credentials.json under ~/.claude)
            if real in hidden or _under(real, rw):
                continue
            hidden.append(real)
            if not real.is_dir():
                files.add(real)
    # a private /tmp hides whatever lives there: the home, the python that runs the relay, the relay itself
    want = [hm, Path(sys.prefix), Path(sys.base_prefix), RELAY.parent, *program_roots(programs, path)]
    visible = tuple(sorted({p for p in want if _under(p, PRIVATE_TMP) and p.exists()
                            and not _under(p, (proj, *rw))}, key=lambda p: len(p.parts)))
    td = _real(tmpdir) if tmpdir else None
    if td is not None and not _under(td, PRIVATE_TMP):
        td = None  # elsewhere it is a path like any other (read-only unless it is under the project)
    # read-only again only where it would be writable: inside the project or the agent's state
    ro = tuple(dict.fromkeys(_real(p) for p in readonly if os.path.lexists(p) and _under(_real(p), (proj, *rw))))
    return SandboxSpec(project=proj, home=hm, writable=rw, readonly=ro, hidden=tuple(hidden), hidden_files=frozenset(files),
                       empty=empty_file() if files else Path("/dev/null"), visible=visible, tmpdir=td, relays=relays,
                       env=dict(env or {}), new_session=not interactive)


def bwrap_argv(spec: SandboxSpec, command: list[str], *, bwrap: str = "bwrap", info_fd: int | None = None,
               seccomp_fd: int | None = None) -> list[str]:
    """bwrap's argv running `command` inside `spec`'s sandbox (through the relay when it has relays).
    Mount order matters: a later mount covers an earlier one, so read-only root, then the private tmps,
    then what must show through them, then the writable paths, then what stays read-only inside them,
    then the masks over credentials."""
    a = [bwrap, "--die-with-parent", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-cgroup-try",
         "--cap-drop", "ALL"]
    if spec.new_session:
        a.append("--new-session")
    if spec.relays:
        a.append("--as-pid-1")  # the relay is init: it reaps, forwards signals, and its exit ends them all
    a += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for t in PRIVATE_TMP:
        a += ["--tmpfs", str(t)]
    if spec.tmpdir is not None:
        a += ["--dir", str(spec.tmpdir)]
    for p in spec.visible:
        a += ["--ro-bind", str(p), str(p)]
    for p in (spec.project, *sorted(spec.writable, key=lambda p: len(p.parts))):
        a += ["--bind", str(p), str(p)]
    for p in spec.readonly:
        a += ["--ro-bind", str(p), str(p)]
    for p in spec.hidden:
        if p in spec.hidden_files:
            a += ["--ro-bind", str(spec.empty), str(p)]
        else:
            a += ["--tmpfs", str(p), "--remount-ro", str(p)]
    for d in spec.sockets:
        a += ["--ro-bind", str(d), str(d)]
    for k, v in sorted(spec.env.items()):
        a += ["--setenv", k, v]
    a += ["--chdir", str(spec.project)]
    if info_fd is not None:
        a += ["--info-fd", str(info_fd)]
    if seccomp_fd is not None:
        a += ["--seccomp", str(seccomp_fd)]
    a.append("--")
    if spec.relays:
        a += [spec.python, "-I", "-S", str(RELAY)]
        for r in spec.relays:
            a += ["--listen", f"{r.port}={r.socket}"]
        a.append("--")
    return a + list(command)
