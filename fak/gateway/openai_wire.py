"""The OpenAI wire: /v1/chat/completions, /v1/completions, /v1/models, /tokenize, /detokenize.

Every request becomes n scheduler requests (choices) on the booted engine; their events reach the
handler through fak.gateway.bridge without blocking the event loop. A client that goes away
(streaming or not) cancels its lanes, which frees their KV blocks at the next scheduler step.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from fak.gateway.bridge import Finished, Piece, cancel_all, merged
from fak.gateway.errors import APIError
from fak.gateway.schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest

router = APIRouter()
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop"}


def served(request: Request) -> Any:
    """The booted engine, or 503 while the model is still loading."""
    b = request.app.state.booted
    if b is None:
        raise APIError(503, request.app.state.boot_status, type="service_unavailable", code="booting",
                       headers={"Retry-After": "1"})
    return b


def check_model(request: Request, model: str | None) -> str:
    name = request.app.state.model_name
    if model is not None and model != name:
        raise APIError(404, f"model {model!r} is not served here (this server serves {name!r})",
                       type="not_found_error", param="model", code="model_not_found")
    return name


def _limits(b: Any, n_prompt: int, asked: int | None) -> int:
    ctx = int(b.model.config.context_length)
    if n_prompt == 0:
        raise APIError(400, "the prompt encodes to no tokens", param="prompt")
    new = asked if asked is not None else ctx - n_prompt
    if n_prompt + new > ctx:
        raise APIError(400, f"this model's context length is {ctx} tokens; the prompt has {n_prompt} and "
                       f"max_tokens asks for {new} more", param="max_tokens", code="context_length_exceeded")
    return new


def _admit(request: Request, b: Any, ids: list[int], body: Any, new: int) -> list[Any]:
    from engine.errors import EngineError
    from engine.model.sampling import SamplingParams
    from engine.sched.lane import Request as LaneRequest

    bad = body.unsupported()
    if bad is not None:
        raise APIError(400, f"{bad}: not supported yet (only its default is accepted)", param=bad,
                       code="unsupported_parameter")
    limit = request.app.state.max_queue
    if limit and b.scheduler.stats().waiting + body.n > limit:
        raise APIError(429, f"the request queue is full ({limit} waiting); retry shortly", type="rate_limit_error",
                       code="queue_full", headers={"Retry-After": "1"})
    bias = _logit_bias(body.logit_bias, int(b.model.config.vocab_size))
    handles = []
    try:
        for i in range(body.n):
            seed = None if body.seed is None else body.seed + i
            params = SamplingParams(temperature=body.temperature, top_k=body.top_k, top_p=body.top_p, seed=seed,
                                    min_p=body.min_p, presence_penalty=body.presence_penalty,
                                    frequency_penalty=body.frequency_penalty,
                                    repetition_penalty=body.repetition_penalty, logit_bias=bias)
            handles.append(b.scheduler.admit(LaneRequest(list(ids), max_new_tokens=new, stop_strings=body.stops(),
                                                         sampling=params, request_id=f"{uuid.uuid4().hex[:12]}-{i}",
                                                         logprobs=body.logprob_k())))
    except EngineError as exc:
        cancel_all(handles)
        raise APIError(400, str(exc)) from None
    return handles


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
    prompt = results[0].prompt_tokens if results else 0
    completion = sum(len(r.token_ids) for r in results)
    cached = max((r.prefix_hit_tokens for r in results), default=0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _finish(r: Any) -> str:
    if r.finish_reason.value == "error":
        raise APIError(500, f"generation failed: {r.error}", type="server_error", code="engine_error")
    return FINISH[r.finish_reason.value]


async def _collect(request: Request, handles: list[Any]) -> list[Any]:
    """Wait for every choice; a client that disconnects meanwhile cancels them."""
    results: list[Any] = [None] * len(handles)

    async def consume() -> None:
        async for item in merged(handles):
            if isinstance(item, Finished):
                results[item.index] = item.result

    task = asyncio.create_task(consume())
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=0.1)
            if not task.done() and await request.is_disconnected():
                cancel_all(handles)
                task.cancel()
                raise APIError(499, "client closed the request", code="client_closed")
        task.result()
    finally:
        cancel_all(handles)
    return results


def _sse(obj: dict[str, Any] | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'))}\n\n"


async def _stream(request: Request, handles: list[Any], body: Any, make: Any, role: bool) -> AsyncIterator[str]:
    """SSE: one opening chunk per choice (chat: delta.role), text deltas, one finish chunk per choice,
    the usage chunk when asked, then [DONE]. A disconnect lands in `finally` and cancels the lanes.
    With logprobs every token gets a chunk (its text may be held back: part of a character or of a
    possible stop string), carrying that token's entry."""
    results: list[Any] = [None] * len(handles)
    want_lp = body.logprob_k() is not None
    seen = [0] * len(handles)
    try:
        if role:
            for i in range(len(handles)):
                yield _sse(make(i, "", None, True))
        async for item in merged(handles):
            if isinstance(item, Piece):
                lps = None
                if want_lp and item.token >= 0:
                    lps = [handles[item.index].logprobs[seen[item.index]]]
                    seen[item.index] += 1
                if item.text or lps:
                    yield _sse(make(item.index, item.text, None, False, lps))
            else:
                results[item.index] = item.result
                if item.result.finish_reason.value == "error":
                    yield _sse({"error": {"message": f"generation failed: {item.result.error}",
                                          "type": "server_error", "param": None, "code": "engine_error"}})
                    continue
                yield _sse(make(item.index, "", _finish(item.result), False))
        if body.stream_options is not None and body.stream_options.include_usage:
            yield _sse(make(None, "", None, False) | {"choices": [], "usage": _usage(results)})
        yield _sse("[DONE]")
    finally:
        cancel_all(handles)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    from engine.errors import EngineError

    b = served(request)
    name = check_model(request, body.model)
    messages = [_message(m.model_dump(exclude_none=True)) for m in body.messages]
    try:
        ids = b.tokenizer.encode_chat(messages)
    except EngineError as exc:
        raise APIError(400, f"messages: {exc}", param="messages") from None
    new = _limits(b, len(ids), body.max_completion_tokens or body.max_tokens)
    handles = _admit(request, b, ids, body, new)
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    tok = b.tokenizer

    def chunk(i: int | None, text: str, finish: str | None, opening: bool, lps: Any = None) -> dict[str, Any]:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if opening else ({"content": text} if text else {})
        lp = None if lps is None else {"content": [_chat_lp(tok, e) for e in lps]}
        choices = [] if i is None else [{"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}]
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": name, "choices": choices}

    if body.stream:
        return StreamingResponse(_stream(request, handles, body, chunk, role=True), media_type="text/event-stream")
    results = await _collect(request, handles)
    want = body.logprob_k() is not None
    choices = [{"index": i, "message": {"role": "assistant", "content": r.text or ""},
                "logprobs": {"content": [_chat_lp(tok, e) for e in r.logprobs]} if want else None,
                "finish_reason": _finish(r)} for i, r in enumerate(results)]
    return JSONResponse({"id": cid, "object": "chat.completion", "created": created, "model": name,
                         "choices": choices, "usage": _usage(results)})


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
    """Content given as parts ([{"type": "text", "text": ...}]) joined to the string templates expect."""
    content = m.get("content")
    if content is None:  # an assistant turn that only called tools: templates expect a string
        m["content"] = ""
    elif isinstance(content, list):
        texts = []
        for part in content:
            if part.get("type") != "text":
                raise APIError(400, f"messages: content part type {part.get('type')!r} is not supported (text only)",
                               param="messages")
            texts.append(str(part.get("text", "")))
        m["content"] = "".join(texts)
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
    new = _limits(b, len(ids), body.max_tokens if "max_tokens" in body.model_fields_set else 16)
    handles = _admit(request, b, ids, body, new)
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

    tok = b.tokenizer

    def chunk(i: int | None, text: str, finish: str | None, opening: bool, lps: Any = None) -> dict[str, Any]:
        lp = None if lps is None else _completion_lp(tok, lps)
        choices = [] if i is None else [{"index": i, "text": text, "logprobs": lp, "finish_reason": finish}]
        return {"id": cid, "object": "text_completion", "created": created, "model": name, "choices": choices}

    if body.stream:
        return StreamingResponse(_stream(request, handles, body, chunk, role=False), media_type="text/event-stream")
    results = await _collect(request, handles)
    want = body.logprob_k() is not None
    choices = [{"index": i, "text": r.text or "", "logprobs": _completion_lp(tok, r.logprobs) if want else None,
                "finish_reason": _finish(r)} for i, r in enumerate(results)]
    return JSONResponse({"id": cid, "object": "text_completion", "created": created, "model": name,
                         "choices": choices, "usage": _usage(results)})


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    b = request.app.state.booted
    entry = {"id": request.app.state.model_name, "object": "model", "created": request.app.state.created,
             "owned_by": "fak"}
    if b is not None:
        entry["max_model_len"] = int(b.model.config.context_length)
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
    out: dict[str, Any] = {"tokens": ids, "count": len(ids), "max_model_len": int(b.model.config.context_length)}
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
