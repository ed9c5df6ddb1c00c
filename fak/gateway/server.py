"""`fak serve`'s lifecycle: listen at once, boot in the background, serve with uvicorn until a signal (drained,
exit 0) or a failed boot (one line), then close the engine and the journal; the optional live view redraws the
engine's panel on stderr meanwhile."""

from __future__ import annotations

from typing import Any


def uvicorn_server(app: object, *, log_level: str, graceful: float, access_log: bool = True) -> Any:
    """The one uvicorn runner (fak serve's, and LocalServer's for guard, chat and agent): no lifespan, no
    logging config of uvicorn's own (fak's logs are set up by fak.gateway.logs)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: object) -> None:
            # SIGINT / SIGTERM: drain (bounded by timeout_graceful_shutdown), then exit 0; uvicorn
            # would re-raise the signal after draining, which ends the process with -SIG instead
            super().handle_exit(sig, frame)  # type: ignore[arg-type]
            self._captured_signals.clear()

    config = uvicorn.Config(app, log_level=log_level, access_log=access_log, timeout_graceful_shutdown=graceful,  # type: ignore[arg-type]
                            lifespan="off", log_config=None)
    return Server(config)


def live_view(app: object, url: str, stop: object) -> None:
    """Redraw the scheduler panel and the request counts a few times a second until `stop` is set."""
    from rich.console import Console
    from rich.live import Live

    from fak.runtime.views import serve_view

    st = app.state  # type: ignore[attr-defined]

    def view() -> object:
        b = st.booted
        total, errors = st.metrics.request_counts()
        from engine.sched.api import split_stats

        split = split_stats(b.scheduler if b is not None else None)  # topology(): P/D workers, pipeline stages
        pd, pipe = split["pd"], split["pipeline"]
        return serve_view(b.scheduler.stats() if b is not None else None, url, total, errors, st.config.model_name,
                          st.boot_status, pd, pipe)

    with Live(view(), console=Console(stderr=True), refresh_per_second=4, transient=False) as lv:
        while not stop.wait(0.25):  # type: ignore[attr-defined]
            lv.update(view())


def run_server(boot: object, served: str, host: str, port: int, key: str | None, cors: list[str],
               max_queue: int, live: bool = False, kernel: object = None, max_model_len: int = 0,
               console: bool = False) -> None:
    import threading

    import uvicorn

    from fak.errors import FakError
    from fak.gateway import create_app
    from fak.gateway.config import ServeConfig
    from fak.gateway.listen import listen_socket
    from fak.gateway.logs import SERVER

    holder: list[uvicorn.Server] = []

    def boot_failed(message: str) -> None:  # the boot thread: stop listening; the error is raised below
        if holder:
            holder[0].should_exit = True

    config = ServeConfig(served, api_key=key, cors_origins=tuple(cors), max_queue=max_queue, max_model_len=max_model_len,
                         console=console)
    app = create_app(boot, config, on_boot_error=boot_failed, kernel=kernel)  # type: ignore[arg-type]
    sock = listen_socket(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    SERVER.info(f"listening on http://{shown}:{bound}", extra={"url": f"http://{shown}:{bound}"})
    stop = threading.Event()
    if live:
        threading.Thread(target=live_view, args=(app, f"http://{shown}:{bound}", stop), name="fak-live",
                         daemon=True).start()

    server = uvicorn_server(app, log_level="warning", graceful=10)
    holder.append(server)
    if app.state.boot_error:  # failed before the server existed
        server.should_exit = True
    try:
        server.run(sockets=[sock])
        if app.state.boot_error:
            raise FakError(app.state.boot_error.removeprefix("boot failed: "))
    finally:
        stop.set()
        b = app.state.booted
        if b is not None:
            b.close()
        if getattr(kernel, "journal", None) is not None:
            kernel.journal.close()  # type: ignore[attr-defined]
