"""The OpenAI Responses wire: POST /v1/responses (streaming with its typed events), served by the
in-kernel model through the same generation core, parsers and kernel as the other wires.

Input items are translated to chat-template messages: `instructions` -> system, message items
(input_text / output_text parts joined), `function_call` items -> an assistant turn's tool_calls,
`function_call_output` items -> `tool` turns. Stateless: `previous_response_id` and `conversation`
are 400s (send the whole input). Fields with no effect on the output here (`store`, `include`,
`metadata`, prompt-cache hints: the prefix cache reuses a repeated prefix by itself, `reasoning`:
the model has no reasoning budget, `service_tier`, `truncation` "disabled") are accepted.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from fak.gateway.bridge import cancel_all
from fak.gateway.errors import APIError
from fak.gateway.generation import (
    CallOut,
    Done,
    GenSpec,
    Out,
    admit,
    check_model,
    choice_events,
    collect,
    gates_for,
    kv_trust,
    limits,
    offered_names,
    served,
    text_parts,
    usage_counts,
)
from fak.gateway.structured import forced_call, json_format
from fak.gateway.toolgate import EmittedCall
from fak.gateway.wires.protocol import ResponsesRequest

router = APIRouter()


_REFUSED = {"previous_response_id": "this server is stateless: send the whole input",
            "conversation": "this server is stateless: send the whole input",
            "prompt": "stored prompts are not available here", "image": "image generation is not available here",
            "max_tool_calls": "not supported yet", "top_logprobs": "not supported yet on this wire"}


_TEXT_KINDS = ("input_text", "output_text", "text")


def to_chat(body: ResponsesRequest) -> list[dict[str, Any]]:
    """The input items as chat-template messages."""
    out: list[dict[str, Any]] = []
    if body.instructions:
        out.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        return out + [{"role": "user", "content": body.input}]
    for i, item in enumerate(body.input):
        where = f"input.{i}"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise APIError(400, f"{where}.role: expected user, system, developer or assistant", param="input")
            out.append({"role": "system" if role == "developer" else role,
                        "content": text_parts(item.get("content"), where, "input", _TEXT_KINDS)})
        elif kind == "function_call":
            try:
                args = json.loads(item.get("arguments") or "{}")
            except ValueError:
                raise APIError(400, f"{where}.arguments: not JSON", param="input") from None
            call = {"id": str(item.get("call_id", "")), "type": "function",
                    "function": {"name": str(item.get("name", "")), "arguments": args}}
            if out and out[-1]["role"] == "assistant":  # the calls of one assistant turn
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                        "content": output if isinstance(output, str) else text_parts(output, where, "input", _TEXT_KINDS)})
        elif kind == "reasoning":
            continue  # an earlier turn's reasoning summary: not part of the prompt
        else:
            raise APIError(400, f"{where}: item type {kind!r} is not supported", param="input")
    return out


def _tools(request: Request, body: ResponsesRequest) -> tuple[list[dict[str, Any]] | None, list[str], Any]:
    """The tools for the template, their names, and the grammar of a forced call."""
    if body.tools and request.app.state.config.lenient_tools:
        # fak guard --gguf: an agent's built-in and freeform tools (web_search, tool_search, Codex's
        # custom apply_patch) are left out of the prompt; the local model calls its function tools
        body.tools = [t for t in body.tools if t.type == "function" and t.name]
    if not body.tools:
        return None, [], None
    for i, t in enumerate(body.tools):
        if t.type != "function" or not t.name:
            raise APIError(400, f"tools.{i}: only function tools with a name are supported (got {t.type!r})",
                           param="tools")
    if body.tool_choice == "none":
        return None, [], None
    names = offered_names([str(t.name) for t in body.tools])
    grammar = None
    choice = body.tool_choice
    if choice == "required" or isinstance(choice, dict):
        named = None
        if isinstance(choice, dict):
            if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
                raise APIError(400, "tool_choice: expected {\"type\": \"function\", \"name\": ...}",
                               param="tool_choice")
            named = choice["name"]
        grammar = forced_call(request.app.state.tool_family, {str(t.name): t.parameters for t in body.tools}, named)
    return [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                              "parameters": t.parameters or {"type": "object"}}}
            for t in body.tools], names, grammar


class _Resp:
    """The response object as it grows (the stream's snapshots and the final body share it)."""

    def __init__(self, body: ResponsesRequest, model: str) -> None:
        self.id, self.created = f"resp_{uuid.uuid4().hex}", int(time.time())
        self.body, self.model = body, model
        self.output: list[dict[str, Any]] = []

    def obj(self, status: str, done: Done | None = None) -> dict[str, Any]:
        b = self.body
        out: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created, "status": status, "model": self.model,
            "output": self.output, "error": None, "incomplete_details": None, "instructions": b.instructions,
            "max_output_tokens": b.max_output_tokens, "parallel_tool_calls": b.parallel_tool_calls is not False,
            "temperature": b.temperature, "top_p": b.top_p, "tool_choice": b.tool_choice or "auto",
            "tools": [t.model_dump(exclude_none=True) for t in b.tools or []],
            "text": b.text or {"format": {"type": "text"}}, "usage": None, "store": bool(b.store),
            "metadata": b.metadata or {}}
        if done is not None:
            prompt, completion, cached = usage_counts([done.result])
            out["usage"] = {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
                            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
                            "total_tokens": prompt + completion}
            if done.result.finish_reason.value == "length" and not done.called:
                out["incomplete_details"] = {"reason": "max_output_tokens"}
            if done.gate is not None:
                out["fak"] = done.gate.fak_extension()
        return out

    @staticmethod
    def status(done: Done) -> str:
        return "incomplete" if done.result.finish_reason.value == "length" and not done.called else "completed"


def _message(text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": f"msg_{uuid.uuid4().hex[:24]}", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _call_item(c: EmittedCall, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{c.id.removeprefix('call_')}", "call_id": c.id, "name": c.name,
            "arguments": c.arguments, "status": status}


@router.post("/v1/responses")
async def responses(body: ResponsesRequest, request: Request) -> Any:
    from engine.errors import EngineError

    b = served(request)
    name = check_model(request, body.model)
    refused = next((f for f in _REFUSED if getattr(body, f) not in (None, 0)), None)
    if refused is not None:
        raise APIError(400, f"{refused}: {_REFUSED[refused]}", param=refused, code="unsupported_parameter")
    if body.background:
        raise APIError(400, "background: not supported", param="background", code="unsupported_parameter")
    fmt = json_format((body.text or {}).get("format"), "text")
    tools, offered, grammar = _tools(request, body)
    if fmt is not None and grammar is not None:
        raise APIError(400, "text.format: cannot be combined with a forced tool call", param="text")
    messages = to_chat(body)
    try:
        ids = b.tokenizer.encode_chat(messages, tools=tools)
    except EngineError as exc:
        raise APIError(400, f"input: {exc}", param="input") from None
    spec = GenSpec(max_new=limits(request, b, len(ids), body.max_output_tokens, "max_output_tokens"),
                   temperature=body.temperature, top_p=body.top_p, grammar=grammar or fmt,
                   grammar_param="tools" if grammar is not None else "text",
                   kv=kv_trust(request, messages, body.safety_identifier or body.user, body.cache_salt))
    handles = admit(request, b, ids, spec)
    gates = gates_for(request, 1, offered, request.app.state.tool_family)
    events = choice_events(handles, gates)
    resp = _Resp(body, name)
    if body.stream:
        return StreamingResponse(_stream(handles, events, resp), media_type="text/event-stream")
    got = (await collect(request, events, 1, handles))[0]
    assert got.done is not None
    if got.text or not got.calls:
        resp.output.append(_message(got.text))
    resp.output += [_call_item(c) for c in got.calls]
    return JSONResponse(resp.obj(_Resp.status(got.done), got.done))


async def _stream(handles: list[Any], events: AsyncIterator[Out | CallOut | Done], resp: _Resp) -> AsyncIterator[str]:
    """response.created / in_progress, then per output item: added, its deltas, done; then
    response.completed (or response.incomplete when it ran out of tokens)."""
    seq = 0

    def ev(kind: str, **data: Any) -> str:
        nonlocal seq
        seq += 1
        payload = json.dumps({"type": kind, "sequence_number": seq - 1, **data}, separators=(",", ":"),
                             ensure_ascii=False)
        return f"event: {kind}\ndata: {payload}\n\n"

    text_item: dict[str, Any] | None = None
    parts: list[str] = []

    def close_text() -> list[str]:
        nonlocal text_item
        if text_item is None:
            return []
        i, item = len(resp.output) - 1, text_item
        text = "".join(parts)
        item["status"], item["content"][0]["text"] = "completed", text
        part = item["content"][0]
        text_item = None
        return [ev("response.output_text.done", item_id=item["id"], output_index=i, content_index=0, text=text,
                   logprobs=[]),
                ev("response.content_part.done", item_id=item["id"], output_index=i, content_index=0, part=part),
                ev("response.output_item.done", output_index=i, item=item)]

    try:
        yield ev("response.created", response=resp.obj("in_progress"))
        yield ev("response.in_progress", response=resp.obj("in_progress"))
        async for e in events:
            if isinstance(e, Out) and e.text:
                if text_item is None:
                    text_item = _message("", "in_progress")
                    parts.clear()
                    resp.output.append(text_item)
                    i = len(resp.output) - 1
                    yield ev("response.output_item.added", output_index=i,
                             item=text_item | {"content": []})
                    yield ev("response.content_part.added", item_id=text_item["id"], output_index=i, content_index=0,
                             part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
                parts.append(e.text)
                yield ev("response.output_text.delta", item_id=text_item["id"], output_index=len(resp.output) - 1,
                         content_index=0, delta=e.text, logprobs=[])
            elif isinstance(e, CallOut):
                for line in close_text():
                    yield line
                item = _call_item(e.call)
                resp.output.append(item)
                i = len(resp.output) - 1
                yield ev("response.output_item.added", output_index=i, item=item | {"arguments": "",
                                                                                    "status": "in_progress"})
                yield ev("response.function_call_arguments.delta", item_id=item["id"], output_index=i,
                         delta=item["arguments"])
                yield ev("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                         arguments=item["arguments"], name=item["name"])
                yield ev("response.output_item.done", output_index=i, item=item)
            elif isinstance(e, Done):
                if e.failed:
                    yield ev("error", code="engine_error", message=f"generation failed: {e.result.error}", param=None)
                    return
                if not resp.output:  # an empty reply is still one (empty) message
                    text_item = _message("", "in_progress")
                    parts.clear()
                    resp.output.append(text_item)
                    yield ev("response.output_item.added", output_index=0, item=text_item | {"content": []})
                    yield ev("response.content_part.added", item_id=text_item["id"], output_index=0, content_index=0,
                             part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
                for line in close_text():
                    yield line
                status = _Resp.status(e)
                yield ev("response.completed" if status == "completed" else "response.incomplete",
                         response=resp.obj(status, e))
    finally:
        cancel_all(handles)
