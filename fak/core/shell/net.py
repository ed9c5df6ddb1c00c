"""Commands that reach the network (curl, wget, nc, socat, ssh, openssl) and what they carry: a secret piped
in, a file uploaded, a shell wired to a socket, a directory served."""

from __future__ import annotations

import re
from dataclasses import replace

from fak.core.shell.argv import (
    _URLISH,
    ENV_DUMPS,
    METADATA_HOSTS,
    READERS,
    SEARCHERS,
    _alts,
    _first,
    _name,
    _opts_and_args,
    _own_service,
    _upstream,
    _url_host,
)
from fak.core.shell.parse import SECRET, Cmd, Word
from fak.core.shell.targets import UNKNOWN, classify, display, resolve


class NetCommands:
    """A family of Judge's command handlers (c_<name>), mixed into fak.core.shell.commands.Judge."""


    def serve(self, args: list[Word], c: Cmd, how: str) -> None:
        """A static file server: what it serves is sent to whoever asks (home serves its keys with it)."""
        words = [_first(w) for w in args]
        d = next((words[i + 1] for i, a in enumerate(words[:-1]) if a in ("--directory", "-d", "-h", "--root")), None)
        d = d or next((a.split("=", 1)[1] for a in words if a.startswith("--directory=")), None) or "."
        p = self.follow(resolve(d, c.where))
        cls = classify(p, c.where)
        if cls in ("home", "root", "credential", "system", "agent-state"):
            self.add("send", display(p, c.where), "credential", how + " of " + display(p, c.where))

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

    def c_ztcp(self, args: list[Word], c: Cmd) -> None:
        self.add("run-remote", _first(args[0]) if args else "network", "network", "zsh ztcp (a socket in the shell)")
