"""One sandboxed agent session (fak guard): a private socket directory holding the gateway's unix socket
and the allow-list proxy's, the spec that relays both into the sandbox's loopback, and the spawn of the
agent under bwrap.

    box = Session(["pypi.org"], who="fak guard")      # bwrap found, proxy listening
    gw = LocalServer(app, unix=box.gateway_socket)     # the gateway also on the socket
    box.configure(os.getcwd(), home, gateway_port=port, writable=state)
    argv = box.wrap(agent_argv); pid = spawn(argv); box.spawned(); box.init_pid()
    box.close()
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from fak.errors import FakError
from fak.sandbox.bwrap import Relay, SandboxSpec, bwrap_argv, contain, require_bwrap
from fak.sandbox.proxy import AllowList, NetProxy
from fak.sandbox.seccomp import filter_fd

PROXY_PORT = 3128  # inside the sandbox's own network namespace: nothing else listens there
PROXY_VARS = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy")
LOOPBACK = "127.0.0.1,localhost,::1"


class Session:
    def __init__(self, allow_net: list[str] | tuple[str, ...] = (), *, who: str = "fak guard") -> None:
        self.who = who
        self.bwrap = require_bwrap(who)
        self.allow = AllowList(allow_net)
        # 0700: only this user reaches the sockets; a unix socket's path has ~108 bytes, so not under a long TMPDIR
        base = tempfile.gettempdir() if len(tempfile.gettempdir()) < 64 else "/tmp"
        self.dir = Path(tempfile.mkdtemp(prefix="fak-sandbox-", dir=base))
        self.gateway_socket = self.dir / "gateway.sock"
        self.proxy = NetProxy(self.allow, self.dir / "proxy.sock")
        self.spec: SandboxSpec | None = None
        self._info: tuple[int, int] | None = None
        self._seccomp: int | None = None
        self._init_pid: int | None = None
        try:
            self.proxy.start()
        except FakError:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def configure(self, project: str | os.PathLike[str], home: str | os.PathLike[str], *, gateway_port: int,
                  writable: tuple[Path, ...] = (), readonly: tuple[Path, ...] = (), tmpdir: str | None = None,
                  interactive: bool = False, programs: tuple[str, ...] = (), path: str | None = None) -> SandboxSpec:
        port = PROXY_PORT if gateway_port != PROXY_PORT else PROXY_PORT + 1
        url = f"http://127.0.0.1:{port}"
        env = {**{k: url for k in PROXY_VARS}, "NO_PROXY": LOOPBACK, "no_proxy": LOOPBACK}
        relays = (Relay("gateway", gateway_port, self.gateway_socket), Relay("proxy", port, self.proxy.path))
        self.spec = contain(project, home, writable=writable, readonly=readonly, relays=relays, env=env, tmpdir=tmpdir,
                            interactive=interactive, programs=programs, path=path, who=self.who)
        return self.spec

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` as bwrap runs it in this session's sandbox; call `spawned()` once it is started."""
        assert self.spec is not None, "configure() first"
        r, w = os.pipe()
        os.set_inheritable(w, True)
        self._info = (r, w)
        self._seccomp = None if self.spec.new_session else filter_fd()
        return bwrap_argv(self.spec, argv, bwrap=self.bwrap, info_fd=w, seccomp_fd=self._seccomp)

    def spawned(self) -> None:
        """bwrap is running: drop our copies of what it inherited, and learn the pid of its init (the relay)."""
        if self._seccomp is not None:
            os.close(self._seccomp)
            self._seccomp = None
        if self._info is None:
            return
        r, w = self._info
        os.close(w)
        data = b""
        while chunk := os.read(r, 4096):  # bwrap writes it once the namespaces exist, then closes it
            data += chunk
        os.close(r)
        self._info = None
        try:
            self._init_pid = int(json.loads(data)["child-pid"])
        except (ValueError, KeyError, TypeError):
            self._init_pid = None  # bwrap failed before starting it; its own message says why

    @property
    def init_pid(self) -> int | None:
        return self._init_pid

    def report(self) -> dict[str, Any]:
        """What the sandbox allowed and what it refused, for the summary."""
        out: dict[str, Any] = dict(self.spec.describe()) if self.spec is not None else {}
        out["allow_net"] = self.allow.names()
        refused = self.proxy.refused_by_host()
        out["net_refused"] = sum(refused.values())
        out["net_refused_hosts"] = dict(refused.most_common(5))
        out["net_allowed"] = dict(self.proxy.allowed)
        reasons = {f"{r.host}:{r.port}": r.reason for r in self.proxy.refusals}
        out["net_refused_reasons"] = {h: reasons[h] for h in out["net_refused_hosts"]}
        return out

    def close(self) -> None:
        self.proxy.stop()
        for fd in (*(self._info or ()), *((self._seccomp,) if self._seccomp is not None else ())):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
