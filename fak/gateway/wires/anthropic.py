"""The Anthropic Messages wire: POST /v1/messages (streaming with the real event sequence) and
POST /v1/messages/count_tokens, served by the in-kernel model through the same generation core,
parsers and kernel as the OpenAI wire. Errors on these routes come in Anthropic's shape
({"type": "error", "error": {"type", "message"}}; see fak.gateway.errors).

Messages are translated to the chat-template form the OpenAI wire uses: `system` first, text blocks
joined, `tool_use` blocks -> an assistant turn's `tool_calls`, `tool_result` blocks -> `tool` turns.
Fields that do not change the output here (`metadata`, `cache_control` marks: the prefix cache
reuses a repeated prefix by itself, `service_tier`, `speed`, `inference_geo`, `diagnostics`,
`output_config.effort`: the model has no reasoning budget) are accepted; anything that would change
the output and is not implemented (`container`, `thinking` enabled) is a 400 naming it.
`tool_choice` any / tool force a call (a grammar); `output_config.format` json_schema constrains the text. The current
API has no `temperature`; older clients still send `temperature`, `top_p`, `top_k`, honoured here.
"""

from __future__ import annotations

import json
import re
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
from fak.gateway.wires.protocol import CountTokensRequest, MessagesRequest

router = APIRouter()
STOP = {"eos": "end_turn", "stop": "end_turn", "length": "max_tokens", "cancelled": "end_turn"}


def to_chat(body: MessagesRequest | CountTokensRequest) -> list[dict[str, Any]]:
    """Anthropic messages as chat-template messages (OpenAI's roles and tool_calls)."""
    out: list[dict[str, Any]] = []
    system = [text_parts(body.system, "system", "system")] if body.system else []
    # system-role messages (Claude Code's reminders) join the system prompt: every chat template takes
    # a system message first, not every one takes one mid-conversation
    system += [text_parts(m.content, f"messages.{i}.content", f"messages.{i}.content")
               for i, m in enumerate(body.messages) if m.role == "system"]
    if system:
        out.append({"role": "system", "content": "\n\n".join(system)})
    for i, m in enumerate(body.messages):
        where = f"messages.{i}.content"
        if m.role == "system":
            continue
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for block in m.content:
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "tool_use" and m.role == "assistant":
                if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                    raise APIError(400, f"{where}: a tool_use block needs a name and an object input", param=where)
                calls.append({"id": str(block.get("id", "")), "type": "function",
                              "function": {"name": block["name"], "arguments": block.get("input", {})}})
            elif kind == "tool_result" and m.role == "user":
                content = text_parts(block.get("content", ""), where, where)
                if block.get("is_error"):
                    content = f"[error] {content}"
                out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": content})
            elif kind in ("thinking", "redacted_thinking") and m.role == "assistant":
                continue  # earlier turns' reasoning: not part of the prompt a template renders
            else:
                raise APIError(400, f"{where}: block type {kind!r} is not supported in a {m.role} turn", param=where)
        if texts or calls or m.role == "assistant":
            msg: dict[str, Any] = {"role": m.role, "content": "".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def _tools(request: Request, body: MessagesRequest | CountTokensRequest
           ) -> tuple[list[dict[str, Any]] | None, list[str], Any]:
    """The tools for the template, their names, and the grammar of a forced call ("any" / "tool")."""
    if not body.tools:
        return None, [], None
    choice = body.tool_choice
    if choice is not None and choice.type == "none":
        return None, [], None
    names = offered_names([t.name for t in body.tools])
    grammar = None
    if choice is not None and choice.type in ("any", "tool"):
        if choice.type == "tool" and not choice.name:
            raise APIError(400, "tool_choice: type 'tool' needs a name", param="tool_choice")
        grammar = forced_call(request.app.state.tool_family, {t.name: t.input_schema for t in body.tools},
                              choice.name if choice.type == "tool" else None)
    return [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                              "parameters": t.input_schema}}
            for t in body.tools if not t.defer_loading], names, grammar


def _check_thinking(thinking: dict[str, Any] | None) -> None:
    # "adaptive": the model decides whether to think; this one never does, which is a valid answer
    if thinking is not None and thinking.get("type") not in (None, "disabled", "adaptive"):
        raise APIError(400, "thinking: extended thinking is not supported by this model (use {\"type\": \"disabled\"})",
                       param="thinking")


def _prompt(request: Request, b: Any, body: MessagesRequest | CountTokensRequest) -> tuple[list[int], list[str], Any]:
    """The prompt ids, the offered tool names, and the grammar (forced call or output_config.format)."""
    from engine.errors import EngineError

    _check_thinking(body.thinking)
    tools, offered, grammar = _tools(request, body)
    if isinstance(body, MessagesRequest):
        if body.container is not None:
            raise APIError(400, "container: code-execution containers are not available here", param="container")
        fmt = json_format((body.output_config or {}).get("format"), "output_config.format")
        if fmt is not None and grammar is not None:
            raise APIError(400, "output_config.format: cannot be combined with a forced tool call",
                           param="output_config")
        grammar = grammar or fmt
    try:
        return b.tokenizer.encode_chat(to_chat(body), tools=tools), offered, grammar
    except EngineError as exc:
        raise APIError(400, f"messages: {exc}", param="messages") from None


def _usage(result: Any) -> dict[str, int]:
    prompt, completion, cached = usage_counts([result])
    # Anthropic's input_tokens are the ones not read from the cache; the three add up to the prompt
    return {"input_tokens": prompt - cached, "output_tokens": completion, "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0}


def _stop(done: Done) -> tuple[str, str | None]:
    if done.called:
        return "tool_use", None
    if done.result.stop_string is not None:
        return "stop_sequence", done.result.stop_string
    return STOP[done.result.finish_reason.value], None


_SESSION = re.compile(r"_session_[0-9a-fA-F-]+$")


def user_identity(user_id: object) -> str | None:
    """The end user a `metadata.user_id` names, for the KV share scope. Claude Code sends its device, account
    and session (a JSON object, or `user_<device>_account_<uuid>_session_<uuid>` in older releases): the
    session changes every run, and is not who the user is, so it is dropped; the user's next session then
    maps the 11k-token prompt it sent yesterday instead of prefilling it again. Any other value is the user."""
    if user_id is None:
        return None
    text = str(user_id)
    try:
        obj = json.loads(text)
    except ValueError:
        return _SESSION.sub("", text)
    if isinstance(obj, dict) and "session_id" in obj:
        return json.dumps({k: v for k, v in obj.items() if k != "session_id"}, sort_keys=True)
    return text


@router.post("/v1/messages")
async def messages(body: MessagesRequest, request: Request) -> Any:
    b = served(request)
    name = check_model(request, body.model)
    ids, offered, grammar = _prompt(request, b, body)
    user = (body.metadata or {}).get("user_id")
    kv = kv_trust(request, to_chat(body), user_identity(user), body.cache_salt)
    spec = GenSpec(max_new=limits(request, b, len(ids), body.max_tokens), temperature=body.temperature,
                   top_p=body.top_p if body.top_p is not None else 1.0, top_k=body.top_k or 0,
                   stops=tuple(body.stop_sequences or ()), grammar=grammar, grammar_param="tools", kv=kv)
    handles = admit(request, b, ids, spec)
    gates = gates_for(request, 1, offered, request.app.state.tool_family, id_prefix="toolu_")
    events = choice_events(handles, gates)
    mid = f"msg_{uuid.uuid4().hex[:24]}"
    if body.stream:
        return StreamingResponse(_stream(handles, events, mid, name, len(ids)), media_type="text/event-stream")
    got = (await collect(request, events, 1, handles))[0]
    assert got.done is not None
    content: list[dict[str, Any]] = [{"type": "text", "text": got.text}] if got.text or not got.calls else []
    content += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.input} for c in got.calls]
    reason, seq = _stop(got.done)
    return JSONResponse({"id": mid, "type": "message", "role": "assistant", "model": name, "content": content,
                         "stop_reason": reason, "stop_sequence": seq, "usage": _usage(got.done.result)}
                        | got.done.fak())


def _event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, separators=(',', ':'), ensure_ascii=False)}\n\n"


async def _stream(handles: list[Any], events: AsyncIterator[Out | CallOut | Done], mid: str, model: str,
                  n_prompt: int) -> AsyncIterator[str]:
    """message_start, then content blocks (text_delta / input_json_delta, each opened and closed),
    message_delta with the stop reason and usage, message_stop."""
    open_text: int | None = None  # index of the text block being streamed, if one is open
    index = 0
    try:
        yield _event("message_start", {"message": {
            "id": mid, "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": None,
            "stop_sequence": None, "usage": {"input_tokens": n_prompt, "output_tokens": 0}}})
        async for ev in events:
            if isinstance(ev, Out) and ev.text:
                if open_text is None:
                    open_text = index
                    index += 1
                    yield _event("content_block_start", {"index": open_text,
                                                         "content_block": {"type": "text", "text": ""}})
                yield _event("content_block_delta", {"index": open_text,
                                                     "delta": {"type": "text_delta", "text": ev.text}})
            elif isinstance(ev, CallOut):
                if open_text is not None:
                    yield _event("content_block_stop", {"index": open_text})
                    open_text = None
                c = ev.call
                yield _event("content_block_start", {"index": index, "content_block": {
                    "type": "tool_use", "id": c.id, "name": c.name, "input": {}}})
                yield _event("content_block_delta", {"index": index, "delta": {
                    "type": "input_json_delta", "partial_json": c.arguments}})
                yield _event("content_block_stop", {"index": index})
                index += 1
            elif isinstance(ev, Done):
                if ev.failed:
                    yield _event("error", {"error": {"type": "api_error",
                                                     "message": f"generation failed: {ev.result.error}"}})
                    return
                if open_text is None and index == 0:  # an empty reply is still one (empty) text block
                    yield _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
                    open_text = 0
                if open_text is not None:
                    yield _event("content_block_stop", {"index": open_text})
                reason, seq = _stop(ev)
                u = _usage(ev.result)
                yield _event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": seq},
                                               "usage": {"output_tokens": u["output_tokens"],
                                                         "input_tokens": u["input_tokens"],
                                                         "cache_read_input_tokens": u["cache_read_input_tokens"]}}
                             | ev.fak())
                yield _event("message_stop", {})
    finally:
        cancel_all(handles)


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request) -> dict[str, int]:
    b = served(request)
    check_model(request, body.model)
    ids, _, _ = _prompt(request, b, body)
    return {"input_tokens": len(ids)}
