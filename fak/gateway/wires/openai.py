"""The OpenAI wire: /v1/chat/completions, /v1/completions, /v1/models, /tokenize, /detokenize.

Every request becomes n scheduler requests (choices) on the booted engine; their events reach the
handler through fak.gateway.bridge without blocking the event loop. A client that goes away
(streaming or not) cancels its lanes, which frees their KV blocks at the next scheduler step.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.sched.trust import UNSCOPED, KVDescriptor
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
    context_len,
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
from fak.gateway.wires.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    NamedToolChoice,
    TokenizeRequest,
)

router = APIRouter()
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop"}


def _spec(b: Any, body: Any, new: int, grammar: Any = None, grammar_param: str | None = None,
          kv: KVDescriptor = UNSCOPED) -> GenSpec:
    bad = body.unsupported()
    if bad is not None:
        raise APIError(400, f"{bad}: not supported yet (only its default is accepted)", param=bad,
                       code="unsupported_parameter")
    return GenSpec(max_new=new, n=body.n, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                   min_p=body.min_p, seed=body.seed, stops=body.stops(), presence_penalty=body.presence_penalty,
                   frequency_penalty=body.frequency_penalty, repetition_penalty=body.repetition_penalty,
                   logit_bias=_logit_bias(body.logit_bias, int(b.model.config.vocab_size)),
                   logprobs=body.logprob_k(), grammar=grammar, grammar_param=grammar_param, kv=kv)


def _logit_bias(given: dict[str, float] | None, vocab: int) -> dict[int, float] | None:
    """OpenAI's {"token id": bias} (-100..100) with ids checked against the vocabulary."""
    if not given:
        return None
    out: dict[int, float] = {}
    for key, bias in given.items():
        try:
            i = int(key)
        except ValueError:
            raise APIError(400, f"logit_bias: key {key!r} is not a token id", param="logit_bias") from None
        if not 0 <= i < vocab:
            raise APIError(400, f"logit_bias: token id {i} outside the vocabulary (0..{vocab - 1})", param="logit_bias")
        if not -100.0 <= bias <= 100.0:
            raise APIError(400, f"logit_bias: bias {bias} for token {i} outside -100..100", param="logit_bias")
        out[i] = float(bias)
    return out


def _usage(results: list[Any]) -> dict[str, Any]:
    prompt, completion, cached = usage_counts(results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _finish(done: Done) -> str:
    return "tool_calls" if done.called else FINISH[done.result.finish_reason.value]


def _sse(obj: dict[str, Any] | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"


def _tool_call_deltas(k: int, call: EmittedCall) -> list[dict[str, Any]]:
    """A call as the stream carries it: the opening delta (index, id, type, name, empty arguments),
    then its arguments (complete: the kernel adjudicated them before anything was sent)."""
    return [{"index": k, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}},
            {"index": k, "function": {"arguments": call.arguments}}]


async def _stream(handles: list[Any], events: AsyncIterator[Out | CallOut | Done], body: Any, make: Any,
                  chat: bool) -> AsyncIterator[str]:
    """SSE: one opening chunk per choice (chat: delta.role), text deltas, tool calls once adjudicated,
    one finish chunk per choice (with the `fak` extension when tools were on), the usage chunk when
    asked, then [DONE]. A disconnect lands in `finally` and cancels the lanes. With logprobs every
    token gets a chunk (its text may be held back: part of a character, of a possible stop string or
    of a tool call), carrying that token's entry."""
    results: list[Any] = [None] * len(handles)
    calls = [0] * len(handles)
    try:
        if chat:
            for i in range(len(handles)):
                yield _sse(make(i, {"role": "assistant", "content": ""}, None))
        async for ev in events:
            if isinstance(ev, Out):
                yield _sse(make(ev.index, ({"content": ev.text} if ev.text else {}) if chat else ev.text, None,
                                ev.logprobs or None))
            elif isinstance(ev, CallOut):
                for d in _tool_call_deltas(calls[ev.index], ev.call):
                    yield _sse(make(ev.index, {"tool_calls": [d]}, None))
                calls[ev.index] += 1
            else:
                results[ev.index] = ev.result
                if ev.failed:
                    yield _sse({"error": {"message": f"generation failed: {ev.result.error}",
                                          "type": "server_error", "param": None, "code": "engine_error"}})
                    continue
                yield _sse(make(ev.index, {} if chat else "", _finish(ev)) | ev.fak())
        if body.stream_options is not None and body.stream_options.include_usage:
            yield _sse(make(None, "", None) | {"choices": [], "usage": _usage(results)})
        yield _sse("[DONE]")
    finally:
        cancel_all(handles)


def _tools(request: Request, body: ChatCompletionRequest) -> tuple[list[dict[str, Any]] | None, list[str], Any]:
    """The tools for the template (None when there are none or tool_choice is "none"), their names,
    and the grammar of a forced call ("required" or a named function) or of response_format."""
    fmt = json_format(body.response_format, "response_format")
    if not body.tools:
        if body.tool_choice not in (None, "none", "auto"):
            raise APIError(400, "tool_choice: forcing a call needs tools", param="tool_choice")
        return None, [], fmt
    names = offered_names([t.function.name for t in body.tools])
    choice = body.tool_choice
    if choice == "none":
        return None, [], fmt
    grammar = fmt
    if choice == "required" or isinstance(choice, NamedToolChoice):
        if fmt is not None:
            raise APIError(400, "response_format: cannot be combined with a forced tool call", param="response_format")
        named = choice.function.get("name") if isinstance(choice, NamedToolChoice) else None
        grammar = forced_call(request.app.state.tool_family, {t.function.name: t.function.parameters
                                                              for t in body.tools}, named)
    return [t.model_dump(exclude_none=True) for t in body.tools], names, grammar


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    from engine.errors import EngineError

    b = served(request)
    name = check_model(request, body.model)
    tools, offered, grammar = _tools(request, body)
    messages = [_message(m.model_dump(exclude_none=True)) for m in body.messages]
    try:
        ids = b.tokenizer.encode_chat(messages, tools=tools)
    except EngineError as exc:
        raise APIError(400, f"messages: {exc}", param="messages") from None
    spec = _spec(b, body, limits(request, b, len(ids), body.max_completion_tokens or body.max_tokens), grammar,
                 "tools" if grammar is not None and body.response_format is None else "response_format",
                 kv_trust(request, messages, body.user, body.cache_salt))
    handles = admit(request, b, ids, spec)
    gates = gates_for(request, spec.n, offered, request.app.state.tool_family)
    events = choice_events(handles, gates, want_logprobs=spec.logprobs is not None)
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    tok = b.tokenizer

    def chunk(i: int | None, delta: Any, finish: str | None, lps: Any = None) -> dict[str, Any]:
        lp = None if lps is None else {"content": [_chat_lp(tok, e) for e in lps]}
        choices = [] if i is None else [{"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}]
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": name, "choices": choices}

    if body.stream:
        return StreamingResponse(_stream(handles, events, body, chunk, chat=True), media_type="text/event-stream")
    got = await collect(request, events, spec.n, handles)
    want = spec.logprobs is not None
    choices = []
    for i, c in enumerate(got):
        assert c.done is not None
        message: dict[str, Any] = {"role": "assistant", "content": c.text if c.text or not c.calls else None}
        if c.calls:
            message["tool_calls"] = [{"id": k.id, "type": "function",
                                      "function": {"name": k.name, "arguments": k.arguments}} for k in c.calls]
        choices.append({"index": i, "message": message,
                        "logprobs": {"content": [_chat_lp(tok, e) for e in c.logprobs]} if want else None,
                        "finish_reason": _finish(c.done)})
    out = {"id": cid, "object": "chat.completion", "created": created, "model": name, "choices": choices,
           "usage": _usage([c.done.result for c in got if c.done is not None])}
    if gates:
        out["fak"] = {"adjudications": [a for g in gates if g is not None for a in g.fak_extension()["adjudications"]]}
    return JSONResponse(out)


def _token(tok: Any, i: int) -> tuple[str, list[int]]:
    raw = bytes(tok.token_bytes(i))
    return raw.decode("utf-8", errors="replace"), list(raw)


def _chat_lp(tok: Any, e: Any) -> dict[str, Any]:
    text, raw = _token(tok, e.token)
    top = []
    for i, lp in e.top:
        t, r = _token(tok, i)
        top.append({"token": t, "logprob": lp, "bytes": r})
    return {"token": text, "logprob": e.logprob, "bytes": raw, "top_logprobs": top}


def _completion_lp(tok: Any, entries: Any) -> dict[str, Any]:
    tokens = [_token(tok, e.token)[0] for e in entries]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{_token(tok, i)[0]: lp for i, lp in e.top} for e in entries], "text_offset": offsets}


def _message(m: dict[str, Any]) -> dict[str, Any]:
    """A message as chat templates expect it: content parts ([{"type": "text", ...}]) joined to a
    string, tool-call arguments as objects (HF templates `tojson` them; OpenAI sends JSON text)."""
    content = m.get("content")
    if content is None:  # an assistant turn that only called tools: templates expect a string
        m["content"] = ""
    elif isinstance(content, list):
        m["content"] = text_parts(content, "messages", "messages")
    for call in m.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise APIError(400, "messages: a tool_calls entry needs function.name", param="messages")
        if isinstance(fn.get("arguments"), str):
            try:
                fn["arguments"] = json.loads(fn["arguments"] or "{}")
            except ValueError:
                raise APIError(400, f"messages: tool call {fn['name']!r}: arguments are not JSON",
                               param="messages") from None
    return m


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Any:
    b = served(request)
    name = check_model(request, body.model)
    if isinstance(body.prompt, str):
        ids = b.tokenizer.encode(body.prompt)
    else:
        vocab = b.model.config.vocab_size
        bad = [t for t in body.prompt if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"prompt: token id {bad[0]} outside the vocabulary (0..{vocab - 1})", param="prompt")
        ids = list(body.prompt)
    spec = _spec(b, body, limits(request, b, len(ids), body.max_tokens if "max_tokens" in body.model_fields_set else 16),
                 kv=kv_trust(request, [], body.user, body.cache_salt))
    handles = admit(request, b, ids, spec)
    events = choice_events(handles, None, want_logprobs=spec.logprobs is not None)
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    tok = b.tokenizer

    def chunk(i: int | None, text: str, finish: str | None, lps: Any = None) -> dict[str, Any]:
        lp = None if lps is None else _completion_lp(tok, lps)
        choices = [] if i is None else [{"index": i, "text": text, "logprobs": lp, "finish_reason": finish}]
        return {"id": cid, "object": "text_completion", "created": created, "model": name, "choices": choices}

    if body.stream:
        return StreamingResponse(_stream(handles, events, body, chunk, chat=False), media_type="text/event-stream")
    got = await collect(request, events, spec.n, handles)
    want = spec.logprobs is not None
    choices = [{"index": i, "text": c.text, "logprobs": _completion_lp(tok, c.logprobs) if want else None,
                "finish_reason": _finish(c.done)} for i, c in enumerate(got) if c.done is not None]
    return JSONResponse({"id": cid, "object": "text_completion", "created": created, "model": name,
                         "choices": choices, "usage": _usage([c.done.result for c in got if c.done is not None])})


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    b = request.app.state.booted
    entry = {"id": request.app.state.config.model_name, "object": "model", "created": request.app.state.created,
             "owned_by": "fak"}
    if b is not None:
        entry["max_model_len"] = context_len(request, b)
    return {"object": "list", "data": [entry]}


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    b = served(request)
    check_model(request, body.model)
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give exactly one of prompt or messages", param="prompt")
    if body.messages is not None:
        from engine.errors import EngineError

        try:
            ids = b.tokenizer.encode_chat([_message(m.model_dump(exclude_none=True)) for m in body.messages])
        except EngineError as exc:
            raise APIError(400, f"messages: {exc}", param="messages") from None
    else:
        ids = b.tokenizer.encode(body.prompt, add_special=body.add_special)
    out: dict[str, Any] = {"tokens": ids, "count": len(ids), "max_model_len": context_len(request, b)}
    if body.with_pieces:
        out["pieces"] = [b.tokenizer.decode([i]) for i in ids]
    return out


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
    b = served(request)
    check_model(request, body.model)
    vocab = b.tokenizer.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < vocab]
    if bad:
        raise APIError(400, f"tokens: id {bad[0]} outside the vocabulary (0..{vocab - 1})", param="tokens")
    return {"prompt": b.tokenizer.decode(body.tokens)}
