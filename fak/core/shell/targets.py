"""Where a path points, lexically: `~`, `$HOME`, `..` and globs resolved against the call's working
directory and home, then classified (the project, its .git, the agent's own state, a credential store,
home, the system, a device, temp). No filesystem access: a decision never touches the disk, so a symlink
can point anywhere; that is the sandbox's job.

Unknown parts of a path (a variable set at run time) are `UNKNOWN` characters; a path that is unknown
from its first character is class `unknown`, one that is unknown below a known prefix is classified by
that prefix as the whole of it (`$HOME/$X` may be all of home).
"""

from __future__ import annotations

import fnmatch
import functools
import os
import posixpath
import re
from dataclasses import dataclass, field

UNKNOWN = "\x00"
_MARKS = str.maketrans("", "", "\x01\x02\x03\x04")
GLOB = frozenset("*?[")

# Relative to home. A credential store is never read, written or sent by an agent.
_CREDENTIALS = (
    ".ssh", ".aws", ".gnupg", ".config/gcloud", ".kube", ".docker/config.json", ".netrc", ".git-credentials",
    ".password-store", ".config/gh", ".codex/auth.json", ".claude/.credentials.json", ".npmrc", ".pypirc",
    ".vault-token", ".terraform.d/credentials", ".azure", "Library/Keychains", ".config/hub", ".pgpass",
    ".my.cnf", ".gem/credentials", ".cargo/credentials", ".cargo/credentials.toml", ".config/op",
    ".local/share/keyrings", ".mozilla", ".config/google-chrome", ".config/chromium", ".oci", ".s3cfg",
    ".boto", ".config/doctl", ".fly", ".heroku", ".config/heroku", ".databrickscfg", ".huggingface/token",
    ".cache/huggingface/token", ".config/sops", ".gitlab-token", ".terraformrc",
)
CREDENTIAL_STORES = _CREDENTIALS  # for code that names them relative to a home it computes (code.py)
_SSH_PUBLIC = ("*.pub", "known_hosts", "known_hosts.old", "config")
# ~/.ssh entries and files in credential stores that hold no secret
_NOT_SECRET = (".aws/config", ".docker/daemon.json", ".kube/cache", ".gnupg/pubring.kbx", ".gnupg/gpg.conf")
_AGENT_STATE = (".claude", ".claude.json", ".codex", ".config/fak", ".aider*", ".continue", ".cursor")
_CACHES = (".cache", ".npm", ".cargo/registry", ".cargo/git", ".m2/repository", ".gradle/caches", "go/pkg/mod",
           ".rustup/toolchains", ".pnpm-store", ".yarn/cache", ".local/share/virtualenvs", ".pyenv/versions",
           ".nvm/versions", ".bun/install/cache", ".deno", ".ivy2/cache", ".conda/pkgs", "Library/Caches")
# Files whose change runs code later (persistence), relative to home.
PERSIST_HOME = (
    ".bashrc", ".bash_profile", ".bash_login", ".profile", ".zshrc", ".zshenv", ".zprofile", ".zlogin", ".zlogout",
    ".bash_logout", ".bash_aliases", ".config/fish/*", ".config/systemd/*", ".config/autostart/*", ".local/bin/*",
    "Library/LaunchAgents/*", ".ssh/authorized_keys*", ".ssh/rc", ".ssh/config", ".gitconfig", ".config/git/*",
    ".xinitrc", ".xprofile", ".xsession", ".inputrc", ".vimrc", ".config/nvim/*", ".emacs", ".tmux.conf",
    ".pythonrc", ".npmrc", ".config/pip/*", ".pip/*", ".config/environment.d/*", ".pam_environment",
    ".bun/bin/*", ".cargo/bin/*", ".local/lib/python*/site-packages/*.pth", ".config/containers/*",
)
PERSIST_SYSTEM = ("/etc/cron*", "/var/spool/cron*", "/etc/systemd/*", "/lib/systemd/*", "/usr/lib/systemd/*",
                  "/etc/init.d/*", "/etc/rc*", "/etc/profile*", "/etc/bash.bashrc", "/etc/ld.so.preload",
                  "/etc/sudoers*", "/etc/environment", "/Library/LaunchDaemons/*", "/Library/LaunchAgents/*")
HISTORY = (".bash_history", ".zsh_history", ".history", ".python_history", ".node_repl_history",
           ".local/share/fish/fish_history", ".mysql_history", ".psql_history", ".lesshst", ".viminfo")
_DEVICES = ("sd", "hd", "vd", "xvd", "nvme", "mmcblk", "disk", "rdisk", "loop", "md", "dm-", "mapper", "mem",
            "kmem", "port", "nbd", "sr", "fd0", "zram", "ram")
_NULL_DEVICES = ("/dev/null", "/dev/zero", "/dev/stdout", "/dev/stderr", "/dev/stdin", "/dev/tty", "/dev/random",
                 "/dev/urandom", "/dev/full", "/dev/ptmx")
_TEMP = ("/tmp", "/var/tmp", "/dev/shm", "/private/tmp")
_SYSTEM_SECRETS = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/sudoers", "/etc/ssh/ssh_host_*_key",
                   "/root/.ssh", "/etc/ssl/private", "/var/lib/docker", "/run/secrets", "/var/run/secrets",
                   "/etc/kubernetes/admin.conf", "/etc/kubernetes/pki")


_KEY_FILE = re.compile(r"^id_(?:rsa|ed25519|ecdsa|dsa|ed25519_sk|ecdsa_sk)(?!.*\.pub$)[\w*?.-]*$")
_ENV_TEMPLATES = frozenset({".env.example", ".env.sample", ".env.template", ".env.dist", ".env.defaults", ".env.test"})


@dataclass(frozen=True, slots=True)
class Where:
    """The place a call runs: its working directory, the project root and the home directory."""

    cwd: str
    home: str
    project: str = ""  # defaults to cwd
    user: str = ""
    tmp: str = "/tmp"
    env: dict[str, str] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        if not self.project:
            object.__setattr__(self, "project", self.cwd)
        if not self.user:
            object.__setattr__(self, "user", posixpath.basename(self.home.rstrip("/")) or "root")

    def at(self, cwd: str) -> Where:
        return Where(cwd, self.home, self.project, self.user, self.tmp, self.env)


def _under(path: str, root: str) -> str | None:
    """`path` relative to `root` ('' for root itself), or None when it is not under it."""
    if path == root:
        return ""
    r = root.rstrip("/") + "/"
    return path[len(r):] if path.startswith(r) else None


def _matches(rel: str, entries: tuple[str, ...]) -> bool:
    for e in entries:
        if rel == e or rel.startswith(e + "/") or (any(c in e for c in GLOB) and fnmatch.fnmatchcase(rel, e)):
            return True
        # a glob in the path that could name the entry (~/.s*h, ~/.*) covers it
        head = rel.split("/", 1)[0]
        if any(c in head for c in GLOB) and fnmatch.fnmatchcase(e.split("/", 1)[0], head):
            return True
    return False


def resolve(path: str, where: Where) -> str:
    """An absolute, normalized path (globs and UNKNOWN parts kept)."""
    p = path
    if p.startswith("~"):
        head, _, rest = p[1:].partition("/")
        if head == "" or head == where.user:
            p = where.home + ("/" + rest if rest else "")
        elif UNKNOWN not in head and not any(c in head for c in GLOB):
            p = "/home/" + head + ("/" + rest if rest else "")
    if not p.startswith("/"):
        if p.startswith(UNKNOWN):
            return p
        p = where.cwd.rstrip("/") + "/" + p
    trailing = p.endswith("/") and len(p) > 1
    p = posixpath.normpath(p)
    if p.startswith("//"):
        p = p[1:]
    return p + "/" if trailing and not p.endswith("/") else p


@functools.lru_cache(maxsize=8192)
def classify(path: str, where: Where) -> str:
    """The class of a resolved path (see effect.CLASSES)."""
    if not path or path.startswith(UNKNOWN):
        return "unknown"
    p = path.rstrip("/") or "/"
    unk = p.find(UNKNOWN)
    if unk >= 0:  # unknown below a known prefix: the whole of the prefix's directory
        p = p[:unk].rsplit("/", 1)[0] or "/"
    if p == "/":
        return "root"
    if _KEY_FILE.match(p.rsplit("/", 1)[-1]) and _under(p, where.project) is None:
        return "credential"  # a private key is one wherever it lies
    first = p[1:].split("/", 1)[0]
    if any(c in first for c in GLOB):
        return "root"  # /*, /u?r: could be any top-level directory
    if p in _NULL_DEVICES or p.startswith("/dev/fd/") or p.startswith("/proc/self/fd/"):
        return "null"
    if p.startswith("/dev/tcp/") or p.startswith("/dev/udp/"):
        return "network"
    if p.startswith("/dev/"):
        name = p[5:]
        return "device" if name.startswith(_DEVICES) or any(c in name for c in GLOB) else "system"
    if p.startswith(("/proc/sys", "/sys/", "/proc/sysrq-trigger", "/proc/kcore")) or p == "/sys":
        return "device"
    if "/environ" in p and p.startswith("/proc/"):
        return "credential"
    in_home = _under(p, where.home) is not None
    if not in_home and any(p == s or p.startswith(s + "/") or fnmatch.fnmatchcase(p, s) for s in _SYSTEM_SECRETS):
        return "credential"
    base = p.rsplit("/", 1)[-1]
    if base == ".env" or (base.startswith(".env.") and base not in _ENV_TEMPLATES) or base.endswith(".env"):
        # a project's .env holds its secrets: reading is ordinary work, sending or overwriting is not
        return "project-env" if _under(p, where.project) is not None else "credential"
    proj = _under(p, where.project)
    home = _under(p, where.home)
    if proj is not None and (home is None or len(where.project) > len(where.home)):
        return _project_class(proj)
    if home is not None:
        return _home_class(home)
    for t in (where.tmp, *_TEMP):
        if _under(p, t) is not None:
            return "temp"
    if p.startswith("/home/") or p.startswith("/Users/") or p.startswith("/root"):
        parts = p.split("/")
        rel = "/".join(parts[3:]) if not p.startswith("/root") else "/".join(parts[2:])
        return _home_class(rel)
    return "system"


def covers_all(name: str) -> bool:
    """A glob that names any entry of its directory (*, .*, ?*), not one kind of file (*.pyc)."""
    return any(c in name for c in GLOB) and (fnmatch.fnmatchcase("src", name) or fnmatch.fnmatchcase(".git", name))


def _project_class(rel: str) -> str:
    if rel == "" or ("/" not in rel and covers_all(rel)):
        return "project-root"  # the project itself, or every entry of it (*, .*)
    parts = rel.split("/")
    if ".git" in parts:
        if parts[parts.index(".git") + 1:] == ["info", "exclude"]:
            return "project"  # local ignore rules, nothing runs from them
        return "project-git"
    if parts[0] == ".claude" and len(parts) > 1 and parts[1].startswith("settings"):
        return "agent-state"  # the project's permission settings for the agent itself
    return "project"


def _home_class(rel: str) -> str:
    if rel == "":
        return "home"
    first = rel.split("/", 1)[0]
    if (rel.startswith(".ssh/") and any(fnmatch.fnmatchcase(rel[5:], x) for x in _SSH_PUBLIC)) or rel in _NOT_SECRET:
        return "home"
    if covers_all(first):
        return "home"  # ~/*, ~/.*: every entry of home
    if _matches(rel, _CREDENTIALS):
        return "credential"
    if _matches(rel, _AGENT_STATE):
        return "agent-state"
    if _matches(rel, _CACHES):
        return "cache"
    return "home"


@functools.lru_cache(maxsize=8192)
def is_persist(path: str, where: Where) -> bool:
    """A file whose change runs code later: shell rc files, autostart units, git hooks, cron."""
    p = path.rstrip("/")
    home = _under(p, where.home)
    if home is None and (p.startswith("/home/") or p.startswith("/root/")):
        parts = p.split("/")
        home = "/".join(parts[3:]) if p.startswith("/home/") else "/".join(parts[2:])
    if home is not None and home and any(fnmatch.fnmatchcase(home, g) or home == g for g in PERSIST_HOME):
        return True
    if any(fnmatch.fnmatchcase(p, g) for g in PERSIST_SYSTEM):
        return True
    if p.rsplit("/", 1)[-1] in ("sitecustomize.py", "usercustomize.py") and _under(p, where.project) is None:
        return True  # imported by every Python that starts, wherever the site directory is
    parts = p.split("/")
    if ".git" in parts:
        i = parts.index(".git")
        below = parts[i + 1:]
        return bool(below) and below[0] in ("hooks", "config") or below[:2] == ["info", "attributes"]
    return False


@functools.lru_cache(maxsize=8192)
def is_history(path: str, where: Where) -> bool:
    """Shell history and system logs: wiping them hides what was done."""
    p = path.rstrip("/")
    home = _under(p, where.home)
    if home is not None and any(home == h for h in HISTORY):
        return True
    return p.startswith("/var/log") or p in ("/var/run/utmp", "/var/log/wtmp", "/var/log/btmp")


def display(path: str, where: Where) -> str:
    """A resolved path as a user reads it: ~ for home, . for the working directory."""
    p = path.replace(UNKNOWN, "$?").translate(_MARKS)
    if p == where.home or p == where.home + "/":
        return "~"
    if p.startswith(where.home.rstrip("/") + "/") and not where.cwd.startswith(where.home.rstrip("/") + "/"):
        return "~/" + p[len(where.home.rstrip("/")) + 1:]
    if p == where.cwd:
        return "."
    return p


def home_of(meta_home: str | None) -> str:
    return meta_home or os.path.expanduser("~")
