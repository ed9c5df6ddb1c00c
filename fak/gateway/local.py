"""A fak server inside this process: uvicorn on a thread, on 127.0.0.1 at a port the OS picks
(fak guard's gateway, fak chat's in-kernel model), started before its client and stopped after it."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import httpx

from fak.errors import FakError
from fak.gateway.listen import listen_socket


class LocalServer:
    """`unix`: also serve on this unix socket (fak guard's sandbox reaches the gateway through it)."""

    def __init__(self, app: Any, health: str = "/health", unix: str | None = None) -> None:
        from fak.gateway.server import uvicorn_server

        self.sock = listen_socket("127.0.0.1", 0)
        socks = [self.sock]
        if unix is not None:
            us = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                us.bind(unix)
            except OSError as exc:
                us.close()
                self.sock.close()
                raise FakError(f"cannot listen on {unix} ({exc.strerror or exc})") from None
            os.chmod(unix, 0o600)
            socks.append(us)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.health = health
        # no access log: request lines are the agent's business, and headers carry its credentials
        self.server = uvicorn_server(app, log_level="error", access_log=False, graceful=3)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": socks}, name="fak-local-server",
                                       daemon=True)

    def start(self, *, timeout: float = 300.0, failed: Any = None, ready: Any = None) -> None:
        """Serve, and wait until the health route answers 200. `failed()`: an error message once the
        app cannot come up; `ready()`: True once asking /health makes sense (a model still loading
        answers 503, and each of those would be counted as a server error in the request metrics)."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            err = failed() if failed is not None else None
            if err:
                raise FakError(err)
            if not self.thread.is_alive():
                raise FakError("the local server stopped before it was ready")
            if ready is not None and not ready():
                time.sleep(0.05)
                continue
            try:
                if httpx.get(self.url + self.health, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise FakError(f"the local server was not ready after {timeout:.0f} s")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class InKernelServer:
    """fak serve's app on the in-kernel model, in this process (fak chat, fak agent): a client of it is
    an OpenAI client like any other. Its kernel lets every offered call through, because the caller's
    own kernel is the one that judges the calls it runs (or, in fak agent's baseline arm, none does)."""

    def __init__(self, model: str, *, plain: bool = False, who: str = "fak") -> None:
        import os

        from fak.core.abi import Verdict
        from fak.core.kernel import Kernel
        from fak.gateway import create_app
        from fak.gateway.config import ServeConfig
        from fak.runtime.boot import boot_for_text

        def _boot() -> Any:
            return boot_for_text(model, who, resident=not plain)

        def let_through(call: Any) -> Verdict:
            return Verdict.allow(f"{who}:client-judges")

        self.model = os.path.basename(model)
        self._failed: list[str] = []
        self.app = create_app(_boot, ServeConfig(self.model, any_model=True), kernel=Kernel([let_through]),
                              on_boot_error=self._failed.append)
        self.local = LocalServer(self.app)
        self.url = self.local.url

    def start(self, timeout: float = 600.0) -> None:
        self.local.start(timeout=timeout, ready=lambda: self.app.state.booted is not None,
                         failed=lambda: self._failed[0].removeprefix("boot failed: ") if self._failed else None)

    @property
    def booted(self) -> Any:
        return self.app.state.booted

    def stop(self) -> None:
        self.local.stop()
        if self.booted is not None:
            self.booted.close()
