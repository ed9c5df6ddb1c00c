"""The guard's gateway: the agent's requests go to the upstream provider with their tool results
admitted, the upstream's replies come back with their tool calls adjudicated.

Two shapes, one contract:
- `proxy_app(upstream, guard)`: any provider or OpenAI-compatible server over HTTP. The agent's own
  credentials (Authorization, x-api-key, ...) are forwarded as they are and never logged.
- `inkernel_app(boot, guard)`: fak serve's app on the in-kernel model (its serving loop adjudicates
  the calls with the guard's kernel), any model name accepted (agents name their provider's models).
Both put `AdmitResults` in front, so a tool result reaches a model only after the kernel admitted it.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Callable
from types import ModuleType
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from fak.guard import sse
from fak.guard.state import Guard
from fak.guard.wires import anthropic, chat, responses

WIRES: tuple[ModuleType, ...] = (anthropic, chat, responses)
HEALTH = "/fak/guard/health"
# not forwarded either way: hop-by-hop, or describing a body the proxy re-encodes
_DROP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
         "accept-encoding", "content-encoding", "proxy-authorization", "proxy-connection"}


def wire_for(path: str) -> ModuleType | None:
    for w in WIRES:
        if path in w.PATHS:
            return w
    return None


def _error(wire: ModuleType | None, status: int, message: str, kind: str = "api_error") -> JSONResponse:
    return JSONResponse((wire or chat).error_body(message, kind), status_code=status)


class AdmitResults:
    """ASGI middleware: a POST to a wire's path has its tool results admitted (body rewritten) before
    the app behind sees it. A body that is not a JSON object is a 400 in the wire's shape: what cannot
    be read cannot be admitted, so it is not passed on."""

    def __init__(self, app: Any, guard: Guard) -> None:
        self.app, self.guard = app, guard

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        wire = wire_for(scope.get("path", "")) if scope["type"] == "http" and scope.get("method") == "POST" else None
        if wire is None:
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        try:
            body = json.loads(b"".join(chunks))
            if not isinstance(body, dict):
                raise ValueError("expected a JSON object")
        except ValueError as exc:
            await _error(wire, 400, f"fak guard: request body is not a JSON object ({exc})",
                         "invalid_request_error")(scope, receive, send)
            return
        trace = self.guard.trace_id()
        wire.admit_results(body, self.guard, trace)
        scope = {**scope, "fak_trace": trace, "fak_body": body}
        raw = json.dumps(body, ensure_ascii=False).encode()
        scope["headers"] = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
        scope["headers"].append((b"content-length", str(len(raw)).encode()))
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()  # then the client's disconnect, as the app expects

        await self.app(scope, replay, send)


def _upstream_url(base: str, path: str, query: str) -> str:
    base = base.rstrip("/")
    if base.endswith("/v1") and path.startswith("/v1/"):
        path = path[3:]
    return f"{base}{path}" + (f"?{query}" if query else "")


def proxy_app(upstream: str, guard: Guard, *, client: httpx.AsyncClient | None = None) -> Any:
    app = FastAPI(title="fak guard", docs_url=None, redoc_url=None, openapi_url=None)
    timeout = httpx.Timeout(connect=15.0, read=600.0, write=60.0, pool=15.0)
    # TCP_NODELAY: httpx writes a request's headers and body apart, and on a kept-alive connection
    # Nagle then holds the body until the upstream's delayed ACK: +40 ms on every turn (measured)
    nodelay = httpx.AsyncHTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    http = client or httpx.AsyncClient(timeout=timeout, follow_redirects=False, transport=nodelay)

    @app.get(HEALTH)
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok", "upstream": upstream})

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
    async def forward(request: Request, path: str) -> Response:
        wire = wire_for(request.url.path)
        body = request.scope.get("fak_body")
        content = json.dumps(body, ensure_ascii=False).encode() if body is not None else await request.body()
        url = _upstream_url(upstream, request.url.path, request.url.query)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _DROP]
        headers.append(("accept-encoding", "identity"))  # the proxy reads what it forwards
        try:
            resp = await http.send(http.build_request(request.method, url, headers=headers, content=content), stream=True)
        except httpx.HTTPError as exc:
            return _error(wire, 502, f"fak guard: upstream {url} failed: {type(exc).__name__}: {exc}")
        intercept = wire is not None and request.method == "POST" and request.url.path == wire.PATHS[0]
        passed = {k: v for k, v in resp.headers.items() if k.lower() not in _DROP}
        if not intercept or resp.status_code >= 400:  # errors come in the upstream's own wire shape
            data = await resp.aread()
            await resp.aclose()
            return Response(data, status_code=resp.status_code, headers=passed)
        assert wire is not None
        trace = request.scope.get("fak_trace") or guard.trace_id()
        offered = wire.offered(body or {})
        if "text/event-stream" in resp.headers.get("content-type", ""):
            return StreamingResponse(_stream(wire, resp, guard, offered, trace), status_code=resp.status_code,
                                     headers=passed, media_type="text/event-stream")
        data = await resp.aread()
        await resp.aclose()
        try:
            obj = json.loads(data)
        except ValueError:
            return _error(wire, 502, f"fak guard: upstream {url} answered {resp.status_code} with a body that is not "
                          "JSON; its tool calls cannot be judged, so it is not passed on")
        passed.pop("content-type", None)
        return JSONResponse(wire.rewrite(obj, guard, offered, trace), status_code=resp.status_code, headers=passed)

    app.state.close = http.aclose
    return AdmitResults(app, guard)


async def _stream(wire: ModuleType, resp: httpx.Response, guard: Guard, offered: frozenset[str],
                  trace: str) -> AsyncIterator[bytes]:
    stream = wire.Stream(guard, offered, trace)
    try:
        async for ev in sse.parse(resp.aiter_lines()):
            for out in stream.feed(ev):
                yield out
        for out in stream.close():
            yield out
    except httpx.HTTPError as exc:  # the upstream broke off: held calls refused, then the wire's error event
        for out in stream.close():
            yield out
        yield wire.error_frame(f"fak guard: the upstream stream failed: {type(exc).__name__}: {exc}")
    except Exception as exc:  # a fault in the guard itself: stop here, nothing unjudged goes out
        yield wire.error_frame(f"fak guard: internal error while judging the stream: {type(exc).__name__}: {exc}")
    finally:
        await resp.aclose()


def inkernel_app(boot: Callable[[], Any], model_name: str, guard: Guard,
                 on_boot_error: Callable[[str], None] | None = None) -> Any:
    from fak.gateway import create_app
    from fak.gateway.config import ServeConfig

    # Claude Code asks for claude-*, Codex for gpt-*: the in-kernel model answers, within their provider's
    # output limits, with tools only their provider runs (web_search) or freeform ones dropped
    config = ServeConfig(model_name, any_model=True, clamp_max_tokens=True, lenient_tools=True, on_decision=guard.record)
    app = create_app(boot, config, kernel=guard.kernel, on_boot_error=on_boot_error)

    @app.get(HEALTH)
    async def health() -> JSONResponse:
        st = app.state
        return JSONResponse({"status": "ok" if st.booted is not None else "loading", "model": model_name},
                            status_code=200 if st.booted is not None else 503)

    return AdmitResults(app, guard)
