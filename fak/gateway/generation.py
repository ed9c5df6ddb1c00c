"""What every wire shares: the booted engine, limits, admission (n scheduler requests, one per
choice), and the choices' events with tool calls gated by the kernel (fak.gateway.toolgate).

A wire (OpenAI Chat/Completions, Anthropic Messages, OpenAI Responses) turns its body into a GenSpec
and a prompt, admits, then formats the same events, streamed or collected: so a streamed answer and
a non-streamed one are the same answer, calls included.

KV trust (engine/sched/trust.py): every request is admitted with a share scope and a taint.
- Scope: every identity the request carries narrows it, in this order: the API key (the sha256 of
  `Authorization: Bearer KEY` or `X-Api-Key`, whether or not the server checks keys), the end user
  (`user`; Anthropic `metadata.user_id`; Responses `safety_identifier`, else `user`), and an explicit
  `cache_salt` (vLLM's field, on all three wires). The scope is a digest of the parts present; two
  requests share prefix-cache blocks only when every part is equal. None present: the public scope,
  shared by such requests only (a client that sends no key, user or salt: today's behaviour).
- Taint: a request carrying a tool result (`tool` message, `tool_result` block, `function_call_output`
  item) that the kernel's result admitters (`Kernel.admit`) do not ALLOW is tainted: its KV blocks are
  never offered to the prefix cache, so no request maps KV computed from quarantined content. Verdicts
  are memoized per (tool, text), so a long history is judged once, not on every turn.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from engine.sched.trust import PUBLIC, UNSCOPED, KVDescriptor
from fak.gateway.bridge import Finished, cancel_all, merged
from fak.gateway.errors import APIError
from fak.gateway.toolgate import EmittedCall, ToolGate


def served(request: Request) -> Any:
    """The booted engine, or 503 while the model is still loading."""
    b = request.app.state.booted
    if b is None:
        raise APIError(503, request.app.state.boot_status, type="service_unavailable", code="booting",
                       headers={"Retry-After": "1"})
    return b


def check_model(request: Request, model: str | None) -> str:
    name = request.app.state.config.model_name
    if model is not None and model != name and not request.app.state.config.any_model:
        raise APIError(404, f"model {model!r} is not served here (this server serves {name!r})",
                       type="not_found_error", param="model", code="model_not_found")
    return name


def context_len(request: Request, b: Any) -> int:
    """The context a request may use: the model's, or less with `fak serve --max-model-len`."""
    ctx = int(b.model.config.context_length)
    cap = request.app.state.config.max_model_len  # 0: the model's context
    return min(ctx, cap) if cap else ctx


def text_parts(content: Any, where: str, param: str, kinds: tuple[str, ...] = ("text",)) -> str:
    """A string, or a list of text parts ({"type": one of `kinds`, "text": str}) joined; any other part
    is a 400 naming where it is (the wires take text only)."""
    if isinstance(content, str):
        return content
    texts = []
    for part in content or []:
        if not isinstance(part, dict) or part.get("type") not in kinds or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise APIError(400, f"{where}: part type {kind!r} is not supported here (text only)", param=param)
        texts.append(part["text"])
    return "".join(texts)


def offered_names(names: list[str], param: str = "tools") -> list[str]:
    """The tool names a request offers, each once (a 400 names the first repeated one)."""
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise APIError(400, f"{param}: the name {dup!r} is used twice", param=param)
    return names


def limits(request: Request, b: Any, n_prompt: int, asked: int | None, param: str = "max_tokens") -> int:
    """New tokens allowed: `asked`, or the rest of the context; 400 when the prompt + asked overflow."""
    ctx = context_len(request, b)
    if n_prompt == 0:
        raise APIError(400, "the prompt encodes to no tokens", param="prompt")
    new = asked if asked is not None else ctx - n_prompt
    if request.app.state.config.clamp_max_tokens:
        # fak guard --gguf: agents ask for their provider's output limit (Claude Code: 128000); the
        # local model gives what its context has left
        new = max(1, min(new, ctx - n_prompt))
    if n_prompt + new > ctx:
        raise APIError(400, f"this model's context length is {ctx} tokens; the prompt has {n_prompt} and "
                       f"{param} asks for {new} more", param=param, code="context_length_exceeded")
    return new


@dataclass
class GenSpec:
    """A request's generation settings, whatever wire it came from."""

    max_new: int
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stops: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    logprobs: int | None = None  # alternatives per token; None: no logprobs
    grammar: Any = None  # an engine GrammarSpec (structured output, forced tool calls) or None
    grammar_param: str | None = None  # the request field the grammar came from (names it in a 400)
    kv: KVDescriptor = UNSCOPED  # share scope, taint and verdict of the prompt (see kv_trust)


def admit(request: Request, b: Any, ids: list[int], spec: GenSpec) -> list[Any]:
    """Queue one scheduler request per choice (choice i samples with seed + i, taken mod 2**64: OpenAI
    accepts any integer, numpy's generators only non-negative ones); 429 when the queue is full."""
    from engine.errors import EngineError
    from engine.model.sampling import SamplingParams
    from engine.sched.lane import Request as LaneRequest

    limit = request.app.state.config.max_queue
    if limit and b.scheduler.stats().waiting + spec.n > limit:
        raise APIError(429, f"the request queue is full ({limit} waiting); retry shortly", type="rate_limit_error",
                       code="queue_full", headers={"Retry-After": "1"})
    handles: list[Any] = []
    try:
        for i in range(spec.n):
            params = SamplingParams(temperature=spec.temperature, top_k=spec.top_k, top_p=spec.top_p,
                                    seed=None if spec.seed is None else (spec.seed + i) % 2**64, min_p=spec.min_p,
                                    presence_penalty=spec.presence_penalty, frequency_penalty=spec.frequency_penalty,
                                    repetition_penalty=spec.repetition_penalty, logit_bias=spec.logit_bias)
            extra = {} if spec.grammar is None else {"grammar": spec.grammar}
            handles.append(b.scheduler.admit(LaneRequest(list(ids), max_new_tokens=spec.max_new,
                                                         stop_strings=spec.stops, sampling=params,
                                                         request_id=f"{uuid.uuid4().hex[:12]}-{i}",
                                                         logprobs=spec.logprobs, scope=spec.kv.scope,
                                                         tainted=spec.kv.taint, verdict=spec.kv.verdict,
                                                         **extra)))
    except EngineError as exc:
        cancel_all(handles)
        bad_grammar = spec.grammar is not None and str(exc).startswith("invalid grammar")
        raise APIError(400, str(exc), param=spec.grammar_param if bad_grammar else None) from None
    return handles


# -- KV trust: the scope and taint of a request (see the module docstring) -------------------------
def kv_scope(request: Request, user: str | None = None, salt: str | None = None) -> str:
    """The share scope: a digest of the API key's hash, the user and the cache salt given, or PUBLIC."""
    headers = request.headers
    auth = headers.get("authorization", "")
    key = auth[7:].strip() if auth.lower().startswith("bearer ") else headers.get("x-api-key")
    parts: list[str] = []
    if key:
        parts.append("key:" + hashlib.sha256(key.encode()).hexdigest()[:32])
    if user:
        parts.append("user:" + user)
    if salt:
        parts.append("salt:" + salt)
    if not parts:
        return PUBLIC
    return "s" + hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


_VERDICTS_MAX = 4096  # memoized result verdicts per app (cleared when full)


def result_verdict(request: Request, tool: str, text: str, call_id: str = "") -> str:
    """The kernel's result admitters on one tool result the client sends back, memoized per app by
    (tool, text); an admitter error counts as QUARANTINE (fail closed)."""
    from fak.core.abi import Result, Status, ToolCall

    st = request.app.state
    memo: dict[tuple[str, str], str] = st.kv_verdicts
    key = (tool, hashlib.sha256(text.encode()).hexdigest())
    v = memo.get(key)
    if v is None:
        call = ToolCall("tool", tool or "?", meta={"source": "client", "call_id": call_id})
        try:
            v = st.kernel.admit(call, Result({"text": text}, Status.OK)).kind.value
        except Exception:  # noqa: BLE001 - a result that cannot be judged is not admitted
            v = "QUARANTINE"
        if len(memo) >= _VERDICTS_MAX:
            memo.clear()
        memo[key] = v
    return v


def kv_trust(request: Request, messages: list[dict[str, Any]], user: str | None = None,
             salt: str | None = None) -> KVDescriptor:
    """The descriptor of a chat-form prompt: its scope, and tainted when a `tool` message's content is
    not ALLOWed by the kernel (the verdict: the first withheld one's kind, else ALLOW)."""
    names: dict[str, str] = {}
    verdict = "ALLOW"
    for m in messages:
        for tc in m.get("tool_calls") or []:
            if isinstance(tc, dict):
                names[str(tc.get("id"))] = str((tc.get("function") or {}).get("name", ""))
        if m.get("role") == "tool" and verdict == "ALLOW":
            content = m.get("content")
            text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
            cid = str(m.get("tool_call_id", ""))
            verdict = result_verdict(request, names.get(cid, ""), text, cid)
    return KVDescriptor(kv_scope(request, user, salt), verdict != "ALLOW", verdict)


# -- the choices' events ---------------------------------------------------------------------------
@dataclass
class Out:
    """Text of choice `index` (may be empty when it only carries a token's logprobs)."""

    index: int
    text: str
    logprobs: list[Any] = field(default_factory=list)


@dataclass
class CallOut:
    """A tool call the kernel let through."""

    index: int
    call: EmittedCall


@dataclass
class Done:
    index: int
    result: Any  # engine.sched.lane.LaneResult
    gate: ToolGate | None

    @property
    def failed(self) -> bool:
        return self.result.finish_reason.value == "error"

    @property
    def called(self) -> bool:
        return self.gate is not None and bool(self.gate.calls)

    def fak(self) -> dict[str, Any]:
        """The `fak` extension object of this choice (empty when tools were off), to merge into a body."""
        return {} if self.gate is None else {"fak": self.gate.fak_extension()}


async def choice_events(handles: list[Any], gates: list[ToolGate | None] | None = None,
                        want_logprobs: bool = False) -> AsyncIterator[Out | CallOut | Done]:
    """The choices' events as they come: text through each choice's gate (when tools are on), calls
    once adjudicated, each token's logprobs entry on the event its token produced."""
    gates = gates or [None] * len(handles)
    seen = [0] * len(handles)

    def passed(i: int, items: list[str | EmittedCall], lps: list[Any]) -> list[Out | CallOut]:
        out: list[Out | CallOut] = []
        for item in items:
            out.append(Out(i, item) if isinstance(item, str) else CallOut(i, item))
        if lps:
            first = next((e for e in out if isinstance(e, Out)), None)
            if first is None:
                out.insert(0, first := Out(i, ""))
            first.logprobs = lps
        return out

    async for item in merged(handles):
        i = item.index
        gate = gates[i]
        if isinstance(item, Finished):
            for ev in passed(i, gate.close() if gate is not None else [], []):
                yield ev
            yield Done(i, item.result, gate)
            continue
        lps: list[Any] = []
        if want_logprobs and item.token >= 0:
            lps = [handles[i].logprobs[seen[i]]]
            seen[i] += 1
        texts: list[str | EmittedCall] = (gate.feed(item.text) if gate is not None else [item.text]) if item.text else []
        for ev in passed(i, texts, lps):
            if isinstance(ev, CallOut) or ev.text or ev.logprobs:
                yield ev


@dataclass
class Choice:
    """One choice collected whole (non-streaming)."""

    text: str = ""
    calls: list[EmittedCall] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    done: Done | None = None


async def collect(request: Request, events: AsyncIterator[Out | CallOut | Done], n: int,
                  handles: list[Any]) -> list[Choice]:
    """Gather every choice; a client that disconnects meanwhile cancels them (499, nobody reads it)."""
    choices = [Choice() for _ in range(n)]

    async def consume() -> None:
        texts: list[list[str]] = [[] for _ in range(n)]
        async for ev in events:
            c = choices[ev.index]
            if isinstance(ev, Out):
                texts[ev.index].append(ev.text)
                c.logprobs += ev.logprobs
            elif isinstance(ev, CallOut):
                c.calls.append(ev.call)
            else:
                c.done = ev
        for c, t in zip(choices, texts, strict=False):
            c.text = "".join(t)

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
    for c in choices:
        if c.done is not None and c.done.failed:
            raise APIError(500, f"generation failed: {c.done.result.error}", type="server_error", code="engine_error")
    return choices


def usage_counts(results: list[Any]) -> tuple[int, int, int]:
    """(prompt tokens, completion tokens over all choices, prompt tokens served from the prefix cache)."""
    prompt = results[0].prompt_tokens if results else 0
    completion = sum(len(r.token_ids) for r in results if r is not None)
    cached = max((r.prefix_hit_tokens for r in results if r is not None), default=0)
    return prompt, completion, cached


def gates_for(request: Request, n: int, tools: list[str] | None, parser: Callable[[], Any] | None,
              id_prefix: str = "call_") -> list[ToolGate | None] | None:
    """One gate per choice when the request offered tools (None: text passes as it is)."""
    if not tools or parser is None:
        return None
    kernel = request.app.state.kernel
    trace = uuid.uuid4().hex[:16]
    hook = request.app.state.config.on_decision
    return [ToolGate(parser(), kernel, frozenset(tools), trace_id=f"{trace}-{i}", id_prefix=id_prefix, on_decision=hook)
            for i in range(n)]
