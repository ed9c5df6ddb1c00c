"""What a command's words say, read the way the command reads them: options and operands (`--` honoured,
option values skipped), the pipeline around it, the hosts and branches it names, and the families of
commands (shells, interpreters, network clients, deleters, readers) the shell model dispatches on."""

from __future__ import annotations

import re
from collections.abc import Iterator

from fak.core.shell.parse import Cmd, Word
from fak.core.shell.targets import UNKNOWN, covers_all

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
