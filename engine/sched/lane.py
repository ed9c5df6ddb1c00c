"""Request and lane records for the scheduler, the lane state machine, and the streaming handle.

A Request is what a caller admits; a Lane is the scheduler's runtime record of it (owned by the loop
thread); a Handle is the caller's side: a token / text-piece stream, the final result, and cancel().
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from engine.errors import EngineError
from engine.grammar.spec import GrammarSpec
from engine.model.sampling import SamplingParams
from engine.sched.trust import KVDescriptor


class LaneState(StrEnum):
    WAITING = "waiting"  # admitted, holds no KV
    PREFILLING = "prefilling"  # running: prompt (or a recompute replay) being prefilled in chunks
    DECODING = "decoding"  # running: one token per scheduler step
    PREEMPTED = "preempted"  # evicted under KV pressure: swapped to host bytes or dropped for recompute
    FINISHED = "finished"  # terminal; see FinishReason


class FinishReason(StrEnum):
    EOS = "eos"
    LENGTH = "length"
    STOP = "stop"
    CANCELLED = "cancelled"
    ERROR = "error"


# The only legal moves; anything else is a scheduler bug and raises.
TRANSITIONS: dict[LaneState, frozenset[LaneState]] = {
    LaneState.WAITING: frozenset({LaneState.PREFILLING, LaneState.FINISHED}),
    LaneState.PREFILLING: frozenset({LaneState.DECODING, LaneState.PREEMPTED, LaneState.FINISHED}),
    LaneState.DECODING: frozenset({LaneState.PREEMPTED, LaneState.FINISHED}),
    LaneState.PREEMPTED: frozenset({LaneState.PREFILLING, LaneState.DECODING, LaneState.FINISHED}),
    LaneState.FINISHED: frozenset(),
}


@dataclass
class Request:
    """One generation request. `prompt` is token ids, or text when the scheduler has a tokenizer."""

    prompt: list[int] | str
    max_new_tokens: int = 16
    stop_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    sampling: SamplingParams = field(default_factory=SamplingParams)
    deadline: float | None = None  # time.monotonic() deadline: earliest-deadline-first admission
    pin_ttl: float = 0.0  # seconds after (re)admission during which the lane is not a preemption victim
    stop_on_eos: bool = True  # stop on the tokenizer's / scheduler's eos ids
    request_id: str = ""
    logprobs: int | None = None  # None: off; k: each token's log-probability and the k most likely
    grammar: GrammarSpec | None = None  # constrained decoding: the output must match it (engine/grammar)
    # trust on KV (engine/sched/trust.py): the prefix cache shares blocks only within one scope ("" = the
    # public scope of scope-less requests); a tainted request's blocks are never offered to it
    scope: str = ""
    tainted: bool = False
    verdict: str = "ALLOW"  # the verdict that admitted the request's content (kept on its cached spans)

    @property
    def kv_descriptor(self) -> KVDescriptor:
        return KVDescriptor(self.scope, self.tainted, self.verdict)


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the model (raw logits, before temperature or top-k/p)
    and the `top` most likely ids with theirs, most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class LaneResult:
    request_id: str
    token_ids: list[int]  # generated ids, without a terminating eos / stop id
    text: str | None  # detokenized output (stop string cut off); None without a tokenizer
    finish_reason: FinishReason
    error: str | None
    prompt_tokens: int
    prefix_hit_tokens: int
    preemptions: int
    ttft_s: float | None  # admit -> first token
    latency_s: float  # admit -> finished
    queue_s: float | None = None  # admit -> first scheduled (time spent waiting)
    itl_s: tuple[float, ...] = ()  # gaps between consecutive emitted tokens
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token_ids entry, when the request asked
    stop_string: str | None = None  # the stop string that ended it (finish reason stop), if one did


def validate_request(r: Request, *, tokenizer: Any, vocab_size: int, context_length: int, kv_blocks: int | None,
                     block_tokens: int) -> list[int]:
    """The request's prompt ids, or one EngineError line saying what is wrong with it."""
    if isinstance(r.prompt, str):
        if tokenizer is None:
            raise EngineError("text prompt given but the scheduler has no tokenizer: pass token ids")
        ids = list(tokenizer.encode(r.prompt))
    else:
        ids = [int(t) for t in r.prompt]
    if not ids:
        raise EngineError("empty prompt: a request needs at least one token")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise EngineError(f"prompt token id {bad[0]} outside the vocabulary (0..{vocab_size - 1})")
    if r.max_new_tokens < 1:
        raise EngineError(f"max_new_tokens must be >= 1, got {r.max_new_tokens}")
    if context_length and len(ids) + r.max_new_tokens > context_length:
        raise EngineError(f"prompt of {len(ids)} + {r.max_new_tokens} new tokens exceeds the context length "
                          f"{context_length}")
    if r.stop_strings and tokenizer is None:
        raise EngineError("stop strings need a tokenizer (pass tokenizer= to the scheduler)")
    if kv_blocks is not None:
        need = -(-(len(ids) + 1) // block_tokens)
        if need > kv_blocks:
            raise EngineError(f"prompt of {len(ids)} tokens needs {need} KV blocks, the budget is {kv_blocks}")
    return ids


class TextTracker:
    """Incremental detokenization plus stop strings: emits only text that cannot start a stop string."""

    def __init__(self, tokenizer: Any, stop_strings: tuple[str, ...]) -> None:
        self._stream = tokenizer.stream(skip_special=True)
        self._stops = tuple(s for s in stop_strings if s)
        self.text = ""  # everything decoded so far
        self.emitted = 0  # chars of self.text already handed out
        self.stopped = False
        self.matched: str | None = None  # the stop string found (the earliest; the first given on a tie)

    def _cut(self, final: bool) -> str:
        hits = [(i, k) for k, i in enumerate(self.text.find(s) for s in self._stops) if i >= 0]
        if hits:
            at, k = min(hits)
            self.text, self.stopped, self.matched = self.text[:at], True, self._stops[k]
            end = len(self.text)
        elif final:
            end = len(self.text)
        else:  # hold back a tail that is a proper prefix of some stop string
            hold = 0
            for s in self._stops:
                for k in range(min(len(s) - 1, len(self.text)), hold, -1):
                    if self.text.endswith(s[:k]):
                        hold = k
                        break
            end = len(self.text) - hold
        out = self.text[self.emitted : end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return out

    def push(self, token: int) -> str:
        self.text += self._stream.push(token)
        return self._cut(final=False)

    def finish(self) -> str:
        if not self.stopped:
            self.text += self._stream.flush()
        return self._cut(final=True)


def _notify(watchers: list[Callable[[], None]]) -> None:
    for w in watchers:
        try:
            w()
        except Exception:  # a watcher's event loop may be gone: that must not stop the scheduler
            pass


class Handle:
    """The caller's side of one lane. Iterate for token ids, `pieces()` for text, `result()` to wait."""

    def __init__(self, request: Request, request_id: str, canceller: Any) -> None:
        self.request = request
        self.request_id = request_id
        self._cancel = canceller
        self._cond = threading.Condition()
        self._events: list[tuple[int, str]] = []  # (token id, text piece) in emission order
        self._result: LaneResult | None = None
        self._watchers: list[Callable[[], None]] = []
        self.logprobs: list[TokenLogprob] = []  # one per token event, appended before its event
        self.state = LaneState.WAITING  # mirrors the lane; written by the loop thread

    # -- loop thread side --
    def _push(self, token: int, piece: str) -> None:
        with self._cond:
            self._events.append((token, piece))
            self._cond.notify_all()
            watchers = list(self._watchers)
        _notify(watchers)

    def _set_result(self, result: LaneResult, tail: str) -> None:
        with self._cond:
            if tail:
                self._events.append((-1, tail))  # flushed text with no token of its own
            self._result = result
            self._cond.notify_all()
            watchers = list(self._watchers)
        _notify(watchers)

    # -- event-loop side (asyncio callers: never block on the condition) --
    def watch(self, notify: Callable[[], None]) -> None:
        """Call `notify()` after every new event and once the request is finished (from the
        scheduler's thread: it must only schedule work, e.g. loop.call_soon_threadsafe)."""
        with self._cond:
            self._watchers.append(notify)
            due = bool(self._events) or self._result is not None
        if due:
            _notify([notify])

    def snapshot(self, start: int) -> tuple[list[tuple[int, str]], LaneResult | None]:
        """Events from index `start` on, and the result if finished (then the events are complete)."""
        with self._cond:
            return self._events[start:], self._result

    # -- caller side --
    @property
    def done(self) -> bool:
        return self._result is not None

    def cancel(self) -> None:
        """Takes effect between scheduler steps; the lane's KV is freed at once then."""
        self._cancel(self)

    def _iter(self, timeout: float | None) -> Iterator[tuple[int, str]]:
        i = 0
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda i=i: i < len(self._events) or self._result is not None, timeout):
                    raise EngineError(f"request {self.request_id}: no token within {timeout} s")
                batch = self._events[i:]
                finished = self._result is not None
            i += len(batch)
            yield from batch
            if finished and i >= len(self._events):
                return

    def tokens(self, timeout: float | None = None) -> Iterator[int]:
        return (t for t, _ in self._iter(timeout) if t >= 0)

    def pieces(self, timeout: float | None = None) -> Iterator[str]:
        return (p for _, p in self._iter(timeout) if p)

    __iter__ = tokens

    def result(self, timeout: float | None = None) -> LaneResult:
        with self._cond:
            if not self._cond.wait_for(lambda: self._result is not None, timeout):
                raise EngineError(f"request {self.request_id}: not finished within {timeout} s")
            assert self._result is not None
            return self._result


@dataclass(eq=False)
class Lane:
    """The loop thread's record of one request. Only the loop thread mutates it (cancel_requested aside)."""

    request: Request
    seq: int  # admission order
    prompt_ids: list[int]
    handle: Handle
    admitted_at: float
    state: LaneState = LaneState.WAITING
    session: Any = None  # engine.model.session.Session while the lane holds KV (or is swapped: the detached session)
    generated: list[int] = field(default_factory=list)
    pending: int | None = None  # last sampled token, not yet fed to the model
    presampled: int | None = None  # this step's first row's token, drawn beside other lanes' (OutputProcessor.presample)
    replay: list[int] = field(default_factory=list)  # recompute: generated ids to re-feed, logits ignored
    swap_data: bytes | None = None  # swap: the lane's KV blocks as host bytes
    swap_length: int = 0
    resume_state: LaneState = LaneState.PREFILLING  # where a swapped lane returns to
    preempt_round: int = 0
    preemptions: int = 0
    prefix_hit_tokens: int = 0
    prefix_checked: bool = False  # the prefix cache was consulted for the current session
    disk_checked: bool = False  # the prefix cache's disk tier was consulted (once per lane)
    prompt_hashes: list[int] | None = None  # chained hashes of full prompt blocks (computed once)
    pinned_until: float = 0.0
    first_token_at: float | None = None
    started_at: float | None = None  # first moved to PREFILLING
    token_times: list[float] = field(default_factory=list)  # when each token was emitted (metrics)
    cancel_requested: bool = False
    finish_reason: FinishReason | None = None
    error: str | None = None
    text: TextTracker | None = None
    rng: np.random.Generator | None = None
    grammar: Any = None  # engine.grammar.Matcher of a constrained request (its state after `generated`)
    draft: Any = None  # engine.sched.draft.LaneDraft while speculative decoding is on
    # admit_prefilled: (blocks already in the pool covering the whole prompt, the prefill's last logits)
    imported: tuple[list[int], np.ndarray] | None = None
    prefilled_elsewhere: bool = False  # admit_prefilled: how its prompt's KV was computed is not known here

    def to(self, new: LaneState) -> None:
        if new not in TRANSITIONS[self.state]:
            raise EngineError(f"lane {self.seq}: illegal transition {self.state.value} -> {new.value}")
        self.state = new
        self.handle.state = new
        if new is LaneState.PREFILLING and self.started_at is None:
            self.started_at = now()

    @property
    def running(self) -> bool:
        return self.state in (LaneState.PREFILLING, LaneState.DECODING)

    def result(self, now: float) -> LaneResult:
        assert self.finish_reason is not None
        return LaneResult(
            request_id=self.handle.request_id,
            token_ids=list(self.generated),
            text=self.text.text if self.text is not None else None,
            finish_reason=self.finish_reason,
            error=self.error,
            prompt_tokens=len(self.prompt_ids),
            prefix_hit_tokens=self.prefix_hit_tokens,
            preemptions=self.preemptions,
            ttft_s=None if self.first_token_at is None else self.first_token_at - self.admitted_at,
            latency_s=now - self.admitted_at,
            queue_s=None if self.started_at is None else self.started_at - self.admitted_at,
            itl_s=tuple(b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)),
            logprobs=tuple(self.handle.logprobs),
            stop_string=self.text.matched if self.text is not None else None,
        )


def now() -> float:
    return time.monotonic()
