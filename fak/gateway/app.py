"""The ASGI app: routers, auth, CORS, /health, /metrics, and the engine booted in the background.

The server listens at once; until the model is loaded /health answers 503 with the boot status and
the model routes 503 `booting`. `boot` is a zero-argument callable returning a fak.runtime.boot.Booted.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response

from fak.gateway import errors, logs
from fak.gateway.config import ServeConfig
from fak.gateway.console import STATIC_PATHS
from fak.gateway.errors import shaped
from fak.gateway.metrics import Metrics
from fak.gateway.wires.anthropic import router as anthropic_router
from fak.gateway.wires.embeddings import router as embeddings_router
from fak.gateway.wires.fak import router as fak_router
from fak.gateway.wires.openai import router as openai_router
from fak.gateway.wires.responses import router as responses_router

PUBLIC = ("/health", "/v1/models", *STATIC_PATHS)  # the console page asks for the key itself


def create_app(boot: Callable[[], Any], config: ServeConfig, *, background: bool = True, kernel: Any = None,
               on_boot_error: Callable[[str], None] | None = None) -> FastAPI:
    """`config`: how to serve (fak/gateway/config.py). `kernel`: the fak.core.kernel.Kernel that adjudicates
    tool calls (default: the coding floor policy). `on_boot_error(message)`: called from the boot thread when
    the model fails to load (serve exits)."""
    app = FastAPI(title="fak serve", version="1", docs_url=None, redoc_url=None)
    errors.install(app)
    st = app.state
    st.config = config
    model_name = config.model_name
    st.booted, st.boot_status, st.boot_error = None, "loading the model", None
    st.created = int(time.time())
    st.kv_verdicts = {}  # (tool, sha256 of a result) -> the admitters' verdict (generation.result_verdict)
    if kernel is None:
        from fak.core.kernel import Kernel
        from fak.core.policy import serving_floor

        kernel = Kernel.with_policy(serving_floor())
    st.kernel = kernel
    st.tool_family = None  # the model's tool-call parser class (a fresh parser per choice), set at boot
    st.metrics = Metrics(model_name, lambda: st.booted.scheduler.stats() if st.booted is not None else None,
                         kernel=lambda: st.kernel)

    def _boot() -> None:
        try:
            booted = boot()
            booted.scheduler.on_finish = st.metrics.finished
            for collector in booted.scheduler.collectors():  # P/D: fak_pd_*; pipeline stages: fak_pipeline_*
                st.metrics.registry.register(collector)
            st.tool_family = _tool_family(booted)
            if booted.scheduler.tokenizer is not None:
                booted.scheduler.warm_grammar()  # ~3 s holding the GIL: now, not on the first constrained request
            st.booted = booted
            st.boot_status = "ready"
        except Exception as exc:  # reported by /health and to the caller, which decides to exit
            st.boot_error = st.boot_status = f"boot failed: {exc}"
            if on_boot_error is not None:
                on_boot_error(st.boot_error)

    if background:
        threading.Thread(target=_boot, name="fak-boot", daemon=True).start()
    else:
        _boot()

    # a plain ASGI middleware, not @app.middleware: BaseHTTPMiddleware wraps `receive`, and the
    # handlers then never see a client's disconnect (non-streaming cancel relies on it)
    app.add_middleware(_AuthAndCount, api_key=config.api_key, metrics=st.metrics)

    if config.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["*"], allow_headers=["*"])

    @app.get("/health")
    async def health() -> JSONResponse:
        if st.booted is None:
            return JSONResponse({"status": "error" if st.boot_error else "loading", "reason": st.boot_status},
                                status_code=503)
        return JSONResponse({"status": "ok", "model": model_name})

    @app.get("/metrics")
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(st.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/fak/stats")
    async def fak_stats() -> JSONResponse:
        """The scheduler snapshot and request counts (what `fak top` draws)."""
        from engine.sched.api import split_stats

        b = st.booted
        total, errors = st.metrics.request_counts()
        return JSONResponse({"model": model_name, "status": st.boot_status, "requests": total, "errors_5xx": errors,
                             "sched": b.scheduler.stats().to_json() if b is not None else None,
                             **split_stats(b.scheduler if b is not None else None)})

    app.include_router(openai_router)
    app.include_router(embeddings_router)
    app.include_router(anthropic_router)
    app.include_router(responses_router)
    app.include_router(fak_router)
    if config.console:
        from fak.gateway.console import install

        install(app)
    return app


def _tool_family(b: Any) -> type:
    """The tool-call parser family of the served model, from its chat template and vocabulary."""
    from fak.gateway.tool_parsers import family_for

    info = getattr(b.tokenizer, "info", None)
    token_id = getattr(b.tokenizer, "token_id", None)
    has = (lambda text: token_id(text) is not None) if token_id is not None else None
    return family_for(getattr(info, "chat_template", None), getattr(b.model.config, "arch", None), has)


class _AuthAndCount:
    """API-key check (public routes and CORS preflights exempt) and per-route HTTP metrics."""

    def __init__(self, app: Any, api_key: str | None, metrics: Metrics) -> None:
        self.app, self.key, self.metrics = app, api_key, metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0, status = time.perf_counter(), [500]

        async def send_status(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if (self.key and scope.get("method") != "OPTIONS" and scope.get("path") not in PUBLIC
                and not _authorized(headers, self.key)):
            resp = JSONResponse(shaped(scope.get("path", ""), "invalid or missing API key (Authorization: Bearer KEY "
                                       "or X-Api-Key)", "authentication_error", None, "invalid_api_key"),
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
            await resp(scope, receive, send_status)
        else:
            await self.app(scope, receive, send_status)
        name = getattr(scope.get("route"), "path", "unmatched")
        self.metrics.http.labels(name, str(status[0])).inc()
        self.metrics.http_latency.labels(name).observe(time.perf_counter() - t0)
        logs.access(scope, name, status[0], t0)


def _authorized(headers: dict[str, str], key: str) -> bool:
    given = headers.get("x-api-key")
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        given = auth[7:].strip()
    return given is not None and hmac.compare_digest(given.encode(), key.encode())
