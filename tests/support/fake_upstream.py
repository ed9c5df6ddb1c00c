"""A scripted fake model provider for tests: Anthropic Messages, OpenAI Chat and
OpenAI Responses, streamed (SSE) and not, on 127.0.0.1 in a background thread.

The script is one function, ``propose(offer) -> [(tool name, arguments)]``: it sees
what a request offers (wire, tool names, whether a tool result is already in it)
and says which tool calls the fake model answers with. Everything else (ids, event
order, argument JSON cut into small pieces, usage) is shaped after what the real
providers send, close enough that the official ``anthropic`` and ``openai`` SDKs,
Claude Code and Codex accept it.

    with FakeUpstream(allowed_and_destructive("echo ok > a.txt", "rm -rf /")) as up:
        client = anthropic.Anthropic(base_url=up.url, api_key="x")
        ...
        up.requests[-1].body
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Self

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

WIRES = ("anthropic", "chat", "responses")


@dataclass
class Offer:
    """What one request looks like to the script."""

    wire: str  # "anthropic" | "chat" | "responses"
    tools: list[str]  # tool names offered in the request (in order)
    followup: bool  # the request already carries a tool result
    body: dict[str, Any]  # the raw JSON body

    def schema(self, name: str) -> dict[str, Any] | None:
        """The JSON schema of the offered tool `name` (None for a freeform / custom tool)."""
        for tool in self.body.get("tools") or []:
            if _tool_name(self.wire, tool) == name:
                if self.wire == "anthropic":
                    return tool.get("input_schema")
                if self.wire == "chat":
                    return (tool.get("function") or {}).get("parameters")
                return tool.get("parameters")
        return None

    def kind(self, name: str) -> str:
        """The offered tool's type ("function", "custom", "bash_20250124", ...)."""
        for tool in self.body.get("tools") or []:
            if _tool_name(self.wire, tool) == name:
                return str(tool.get("type") or "function")
        return "function"


Proposal = tuple[str, dict[str, Any]]  # (tool name, arguments object)
Propose = Callable[[Offer], list[Proposal]]


@dataclass
class Recorded:
    method: str
    path: str  # the URL path, without the query string
    query: str  # the raw query string ("beta=true")
    headers: dict[str, str]  # lower-case names
    body: dict[str, Any]
    wire: str | None = None  # the wire the route speaks (None for /v1/models and 404s)
    offer: Offer | None = None
    at: float = field(default_factory=time.monotonic)


# -- scripts -------------------------------------------------------------------

GENERIC_SHELLS = ("bash", "shell", "run_command", "run_shell", "execute_command", "terminal", "sh", "exec")
SHELL_PREFERENCE = ("Bash", "exec_command", "shell_command", "shell", *GENERIC_SHELLS)


def shell_call(offer: Offer, command: str) -> Proposal:
    """A call of the offered shell tool running `command`, in that tool's own shape:
    Claude Code's ``Bash {"command"}``, Codex's ``exec_command {"cmd"}`` or
    ``shell {"command": ["bash", "-lc", cmd]}``, a generic ``bash``/``run_command``/...
    ``{"command"}``. The argument field is read off the offered schema."""
    offered = [n for n in SHELL_PREFERENCE if n in offer.tools]
    offered += [n for n in offer.tools if n not in offered and n.lower() in GENERIC_SHELLS]
    if not offered:
        raise LookupError(f"no shell tool among the offered tools {offer.tools}")
    name = offered[0]
    props = (offer.schema(name) or {}).get("properties") or {}
    if "cmd" in props or (name == "exec_command" and "command" not in props):
        return name, {"cmd": command}
    if (props.get("command") or {}).get("type") == "array" or (name == "shell" and not props):
        return name, {"command": ["bash", "-lc", command]}
    return name, {"command": command}


def allowed_and_destructive(allowed: str, destructive: str) -> Propose:
    """The first request with tools and no tool result gets two shell calls, the
    harmless `allowed` then the `destructive` one; followups and tool-less
    requests get text only."""

    def propose(offer: Offer) -> list[Proposal]:
        if offer.followup or not offer.tools:
            return []
        return [shell_call(offer, allowed), shell_call(offer, destructive)]

    return propose


def first_turn(*commands: str) -> Propose:
    """Like `allowed_and_destructive` with any number of shell commands."""

    def propose(offer: Offer) -> list[Proposal]:
        if offer.followup or not offer.tools:
            return []
        return [shell_call(offer, c) for c in commands]

    return propose


def one_by_one(*commands: str) -> Propose:
    """One shell call per turn, in order: the request carrying N tool results gets `commands[N]` (an
    agent may run the calls of one turn concurrently; these must run in sequence); text once all ran."""

    def propose(offer: Offer) -> list[Proposal]:
        n = tool_results(offer.wire, offer.body)
        return [shell_call(offer, commands[n])] if offer.tools and n < len(commands) else []

    return propose


def no_calls(offer: Offer) -> list[Proposal]:
    return []


# -- reading a request ------------------------------------------------------------


def _tool_name(wire: str, tool: Any) -> str:
    if not isinstance(tool, dict):
        return ""
    if wire == "chat":
        fn = tool.get("function")
        return str(fn.get("name", "")) if isinstance(fn, dict) else str(tool.get("name", ""))
    # Anthropic tools all have a name; a Responses built-in (web_search, local_shell) only a type
    return str(tool.get("name") or tool.get("type") or "")


def _followup(wire: str, body: dict[str, Any]) -> bool:
    if wire == "anthropic":
        for m in body.get("messages") or []:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list) and any(
                isinstance(b, dict) and b.get("type") == "tool_result" for b in content
            ):
                return True
        return False
    if wire == "chat":
        return any(isinstance(m, dict) and m.get("role") in ("tool", "function") for m in body.get("messages") or [])
    items = body.get("input")
    return isinstance(items, list) and any(
        isinstance(i, dict) and str(i.get("type", "")).endswith("_call_output") for i in items
    )


def tool_results(wire: str, body: dict[str, Any]) -> int:
    """How many tool results the request carries."""
    if wire == "anthropic":
        return sum(1 for m in body.get("messages") or [] if isinstance(m, dict) and isinstance(m.get("content"), list)
                   for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_result")
    if wire == "chat":
        return sum(1 for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") in ("tool", "function"))
    items = body.get("input")
    return sum(1 for i in items if isinstance(i, dict) and str(i.get("type", "")).endswith("_call_output")) \
        if isinstance(items, list) else 0


def offer_of(wire: str, body: dict[str, Any]) -> Offer:
    tools = [_tool_name(wire, t) for t in body.get("tools") or []]
    return Offer(wire=wire, tools=[t for t in tools if t], followup=_followup(wire, body), body=body)


# -- writing a reply ----------------------------------------------------------------

_ids = itertools.count(1)


def _id(prefix: str, n: int = 24) -> str:
    return f"{prefix}{next(_ids):0{n}d}"


def pieces(s: str, size: int = 7) -> list[str]:
    """`s` cut into chunks of at most `size` characters (at least one chunk)."""
    return [s[i : i + size] for i in range(0, len(s), size)] or [""]


def _tokens(body: dict[str, Any]) -> int:
    return max(1, len(json.dumps(body)) // 4)


@dataclass
class Reply:
    """One scripted answer: some text, then the tool calls."""

    model: str
    text: str
    calls: list[tuple[str, str, dict[str, Any]]]  # (call id, name, arguments)
    input_tokens: int
    output_tokens: int


def _sse(event: str | None, data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return (f"event: {event}\n" if event else "").encode() + f"data: {payload}\n\n".encode()


# Anthropic Messages

def anthropic_message(r: Reply) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": r.text}] if r.text else []
    content += [{"type": "tool_use", "id": cid, "name": name, "input": args} for cid, name, args in r.calls]
    return {
        "id": _id("msg_fake"),
        "type": "message",
        "role": "assistant",
        "model": r.model,
        "content": content,
        "stop_reason": "tool_use" if r.calls else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": r.input_tokens,
            "output_tokens": r.output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def anthropic_events(r: Reply) -> Iterator[bytes]:
    msg = anthropic_message(r)
    start = {**msg, "content": [], "stop_reason": None, "usage": {**msg["usage"], "output_tokens": 1}}
    yield _sse("message_start", {"type": "message_start", "message": start})
    index = 0
    if r.text:
        yield _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                           "content_block": {"type": "text", "text": ""}})
        yield _sse("ping", {"type": "ping"})
        for piece in pieces(r.text, 5):
            yield _sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                               "delta": {"type": "text_delta", "text": piece}})
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
        index = 1
    else:
        yield _sse("ping", {"type": "ping"})
    for cid, name, args in r.calls:
        yield _sse("content_block_start", {"type": "content_block_start", "index": index,
                                           "content_block": {"type": "tool_use", "id": cid, "name": name, "input": {}}})
        yield _sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                           "delta": {"type": "input_json_delta", "partial_json": ""}})
        for piece in pieces(json.dumps(args)):
            yield _sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                               "delta": {"type": "input_json_delta", "partial_json": piece}})
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
        index += 1
    yield _sse("message_delta", {"type": "message_delta",
                                 "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None},
                                 "usage": {"output_tokens": r.output_tokens}})
    yield _sse("message_stop", {"type": "message_stop"})


# OpenAI Chat Completions

def chat_completion(r: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": r.text or None, "refusal": None}
    if r.calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for cid, name, args in r.calls
        ]
    return {
        "id": _id("chatcmpl-fake"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": r.model,
        "system_fingerprint": "fp_fake",
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": "tool_calls" if r.calls else "stop"}],
        "usage": _chat_usage(r),
    }


def _chat_usage(r: Reply) -> dict[str, int]:
    return {"prompt_tokens": r.input_tokens, "completion_tokens": r.output_tokens,
            "total_tokens": r.input_tokens + r.output_tokens}


def chat_events(r: Reply, include_usage: bool) -> Iterator[bytes]:
    head = {"id": _id("chatcmpl-fake"), "object": "chat.completion.chunk", "created": int(time.time()),
            "model": r.model, "system_fingerprint": "fp_fake"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        c: dict[str, Any] = {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if include_usage:
            c["usage"] = None
        return _sse(None, c)

    yield chunk({"role": "assistant", "content": "", "refusal": None})
    for piece in pieces(r.text, 5) if r.text else []:
        yield chunk({"content": piece})
    for i, (cid, name, args) in enumerate(r.calls):
        yield chunk({"tool_calls": [{"index": i, "id": cid, "type": "function",
                                     "function": {"name": name, "arguments": ""}}]})
        for piece in pieces(json.dumps(args)):
            yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
    yield chunk({}, "tool_calls" if r.calls else "stop")
    if include_usage:
        yield _sse(None, {**head, "choices": [], "usage": _chat_usage(r)})
    yield _sse(None, "[DONE]")


# OpenAI Responses

def _response_items(r: Reply, offer: Offer) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if r.text:
        items.append({"id": _id("msg_fake"), "type": "message", "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": r.text, "annotations": [], "logprobs": []}]})
    for cid, name, args in r.calls:
        if offer.kind(name) == "custom":  # a freeform tool (Codex's apply_patch): the input is raw text
            raw = args["input"] if isinstance(args.get("input"), str) else json.dumps(args)
            items.append({"id": _id("ctc_fake"), "type": "custom_tool_call", "status": "completed",
                          "call_id": cid, "name": name, "input": raw})
        else:
            items.append({"id": _id("fc_fake"), "type": "function_call", "status": "completed",
                          "call_id": cid, "name": name, "arguments": json.dumps(args)})
    return items


def response_object(r: Reply, offer: Offer, rid: str, status: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    body = offer.body
    done = status == "completed"
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": r.model,
        "output": items if done else [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": {
            "input_tokens": r.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": r.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": r.input_tokens + r.output_tokens,
        } if done else None,
        "user": None,
        "metadata": body.get("metadata") or {},
    }


def responses_events(r: Reply, offer: Offer) -> Iterator[bytes]:
    rid = _id("resp_fake")
    items = _response_items(r, offer)
    seq = itertools.count()

    def ev(kind: str, **data: Any) -> bytes:
        return _sse(kind, {"type": kind, "sequence_number": next(seq), **data})

    yield ev("response.created", response=response_object(r, offer, rid, "in_progress", items))
    yield ev("response.in_progress", response=response_object(r, offer, rid, "in_progress", items))
    for oi, item in enumerate(items):
        iid = item["id"]
        if item["type"] == "message":
            yield ev("response.output_item.added", output_index=oi,
                     item={**item, "status": "in_progress", "content": []})
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            yield ev("response.content_part.added", item_id=iid, output_index=oi, content_index=0, part=part)
            for piece in pieces(r.text, 5):
                yield ev("response.output_text.delta", item_id=iid, output_index=oi, content_index=0,
                         delta=piece, logprobs=[])
            yield ev("response.output_text.done", item_id=iid, output_index=oi, content_index=0,
                     text=r.text, logprobs=[])
            yield ev("response.content_part.done", item_id=iid, output_index=oi, content_index=0,
                     part={**part, "text": r.text})
        elif item["type"] == "function_call":
            yield ev("response.output_item.added", output_index=oi,
                     item={**item, "status": "in_progress", "arguments": ""})
            for piece in pieces(item["arguments"]):
                yield ev("response.function_call_arguments.delta", item_id=iid, output_index=oi, delta=piece)
            yield ev("response.function_call_arguments.done", item_id=iid, output_index=oi,
                     name=item["name"], arguments=item["arguments"])
        else:  # custom_tool_call
            yield ev("response.output_item.added", output_index=oi,
                     item={**item, "status": "in_progress", "input": ""})
            for piece in pieces(item["input"]):
                yield ev("response.custom_tool_call_input.delta", item_id=iid, output_index=oi, delta=piece)
            yield ev("response.custom_tool_call_input.done", item_id=iid, output_index=oi, input=item["input"])
        yield ev("response.output_item.done", output_index=oi, item=item)
    yield ev("response.completed", response=response_object(r, offer, rid, "completed", items))


# errors, in each wire's own shape

ANTHROPIC_ERRORS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                    500: "api_error", 529: "overloaded_error"}
OPENAI_ERRORS = {400: ("invalid_request_error", "invalid_request"), 401: ("invalid_request_error", "invalid_api_key"),
                 403: ("invalid_request_error", "forbidden"), 404: ("invalid_request_error", "not_found"),
                 429: ("rate_limit_exceeded", "rate_limit_exceeded"), 500: ("server_error", "server_error"),
                 503: ("server_error", "service_unavailable"), 529: ("server_error", "overloaded")}


def error_body(wire: str | None, status: int, message: str) -> dict[str, Any]:
    if wire == "anthropic":
        kind = ANTHROPIC_ERRORS.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    kind, code = OPENAI_ERRORS.get(status, ("server_error" if status >= 500 else "invalid_request_error", str(status)))
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


# -- the server --------------------------------------------------------------------


class _Dropped(Exception):
    """Raised inside a stream to cut the connection (drop_mid_stream)."""


class FakeUpstream:
    """The scripted provider; a context manager serving on ``url`` until exit."""

    def __init__(
        self,
        propose: Propose | None = None,
        *,
        text: str = "Working on it.",
        fail: int | None = None,
        drop_mid_stream: bool = False,
        model: str | None = None,
    ) -> None:
        self.propose: Propose = propose or no_calls
        self.text = text
        self.fail = fail
        self.drop_mid_stream = drop_mid_stream
        self.model = model  # the model named in replies; default: the one the request asks for
        self.requests: list[Recorded] = []
        self.url = ""
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.app = self._build_app()

    # the recorded traffic, for assertions
    def calls(self, wire: str | None = None) -> list[Recorded]:
        """The model requests (not /v1/models, count_tokens or 404s), optionally of one wire."""
        return [r for r in self.requests if r.offer is not None and (wire is None or r.wire == wire)]

    def followups(self) -> list[Recorded]:
        return [r for r in self.calls() if r.offer is not None and r.offer.followup]

    # -- lifecycle
    def __enter__(self) -> Self:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # else +40 ms per kept-alive request
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="critical", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=1, ws="none")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name=f"fake-upstream-{port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the fake upstream did not start")
            time.sleep(0.01)
        self._sock = sock
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(5)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(5)
        self._sock.close()

    # -- the app
    def _build_app(self) -> FastAPI:
        app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

        @app.api_route("/{path:path}", methods=["GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"])
        async def any_route(request: Request, path: str) -> Response:
            return await self._handle(request)

        return app

    async def _handle(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {"_raw": raw.decode("utf-8", "replace")}
        if not isinstance(body, dict):
            body = {"_json": body}
        path = request.url.path.rstrip("/") or "/"
        route = {("POST", "/v1/messages"): "anthropic", ("POST", "/v1/chat/completions"): "chat",
                 ("POST", "/v1/responses"): "responses", ("POST", "/v1/messages/count_tokens"): "count_tokens",
                 ("GET", "/v1/models"): "models"}.get((request.method, path))
        wire = route if route in WIRES else ("anthropic" if route == "count_tokens" else None)
        rec = Recorded(method=request.method, path=path, query=request.url.query,
                       headers={k.lower(): v for k, v in request.headers.items()}, body=body, wire=wire)
        if route in WIRES:
            rec.offer = offer_of(route, body)
        with self._lock:
            self.requests.append(rec)

        if route is None:
            if path.startswith("/v1/messages"):
                wire = "anthropic"
            return JSONResponse(error_body(wire, 404, f"no route {request.method} {path}"), status_code=404)
        if self.fail is not None:
            return JSONResponse(error_body(wire, self.fail, f"scripted failure {self.fail}"), status_code=self.fail)
        if route == "models":
            return JSONResponse(self._models())
        if route == "count_tokens":
            return JSONResponse({"input_tokens": _tokens(body)})
        assert rec.offer is not None
        try:
            proposals = list(self.propose(rec.offer))
        except Exception as e:  # noqa: BLE001 -- a broken script is the test's bug: say so in the wire's shape
            return JSONResponse(error_body(wire, 500, f"propose raised {type(e).__name__}: {e}"), status_code=500)
        reply = Reply(
            model=self.model or str(body.get("model") or "fake-model"),
            text=self.text,
            calls=[(_id("toolu_fake" if route == "anthropic" else "call_fake"), n, dict(a)) for n, a in proposals],
            input_tokens=_tokens(body),
            output_tokens=max(1, len(self.text) // 4 + sum(len(json.dumps(a)) // 4 for _, a in proposals)),
        )
        if not body.get("stream"):
            if route == "anthropic":
                return JSONResponse(anthropic_message(reply))
            if route == "chat":
                return JSONResponse(chat_completion(reply))
            rid = _id("resp_fake")
            return JSONResponse(response_object(reply, rec.offer, rid, "completed", _response_items(reply, rec.offer)))
        if route == "anthropic":
            events = anthropic_events(reply)
        elif route == "chat":
            events = chat_events(reply, bool((body.get("stream_options") or {}).get("include_usage")))
        else:
            events = responses_events(reply, rec.offer)
        return StreamingResponse(self._paced(events), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache", "x-request-id": _id("req_fake")})

    async def _paced(self, events: Iterator[bytes]) -> AsyncIterator[bytes]:
        for n, chunk in enumerate(events):
            if self.drop_mid_stream and n == 2:
                raise _Dropped("drop_mid_stream")  # uvicorn closes the connection mid-body
            yield chunk
            await asyncio.sleep(0)

    def _models(self) -> dict[str, Any]:
        name = self.model or "fake-model"
        # one list both SDKs read: OpenAI's {object, data[{id, object, created, owned_by}]},
        # Anthropic's {data[{type, id, display_name, created_at}], has_more, first_id, last_id}
        entry = {"id": name, "object": "model", "created": 0, "owned_by": "fak-tests",
                 "type": "model", "display_name": name, "created_at": "2025-01-01T00:00:00Z"}
        return {"object": "list", "data": [entry], "has_more": False, "first_id": name, "last_id": name}
