"""OutputProcessor: what a forward pass's logits do to its lanes (vLLM's output processing).

After a prompt chunk: its full blocks join the prefix cache; the last chunk turns the lane to decoding
and samples its first token (or, after a recompute readmission, starts replaying the generated ids).
After a decode row: a replayed token's logits are dropped, otherwise a token is sampled. A constrained
lane (Request.grammar) first masks its row with its Matcher (-inf where the grammar forbids a token),
and finishes with `stop` once its grammar is complete; an unconstrained lane's path is untouched. Every
sampled token is checked against EOS, stop ids, stop strings and max_new_tokens, then streamed.
Finishing frees the lane's blocks, takes it off the queues and resolves its handle.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from engine.model.sampling import ranked_first, sample
from engine.sched.lane import FinishReason, Lane, LaneResult, LaneState, TokenLogprob, now
from engine.sched.plan import Planner
from engine.sched.prefix_cache import PrefixCache
from engine.sched.profile import NO_PROFILE
from engine.sched.stats import RateMeter

# Sampled rows a step from which their draws run on two threads, and the vocabulary from which it pays: a
# draw over 262,144 logits is ~0.8 ms of numpy (exp, sums, a partition of the head) that releases the GIL,
# 13 of a 16-lane Gemma step's ~57 ms when drawn one after another on the loop thread.
PARALLEL_ROWS = 4
PARALLEL_VOCAB = 32768


class OutputProcessor:
    def __init__(self, planner: Planner, prefix: PrefixCache | None, eos_ids: frozenset[int],
                 counters: dict[str, int], profile: Any = NO_PROFILE) -> None:
        self.planner, self.prefix, self.eos_ids = planner, prefix, eos_ids
        self.profile = profile  # engine.sched.profile: "sample" and "emit" marks
        self.on_finish: Callable[[LaneResult], None] | None = None  # observers, e.g. request metrics
        self.block_tokens = planner.pool.block_tokens
        self.counters = counters  # the loop-thread counters shared with the scheduler
        self.finished: dict[str, int] = {}  # finish reason -> lanes
        self.rate = RateMeter()
        self.drafter: Any = None  # engine.sched.draft.Drafter with speculative decoding on (learns from outputs)
        self._helper: ThreadPoolExecutor | None = None  # presample's second thread (numpy only: no kernels)

    def presample(self, rows: list[tuple[Lane, np.ndarray]]) -> None:
        """Draw the token of each lane's first row of this step now, the lanes split between the loop thread
        and a helper thread: rows sampled with a temperature, no grammar and a large vocabulary, when there
        are PARALLEL_ROWS of them or more. A lane's first row is always sampled (a verifying lane's too: the
        pending token's row comes before any draft is judged), and its generator is the lane's own, so each
        lane draws exactly what it would have drawn in turn; `_sample_and_emit` takes the token."""
        due = [(lane, row) for lane, row in rows
               if lane.grammar is None and not lane.replay and lane.request.sampling.temperature > 0.0
               and row.shape[-1] >= PARALLEL_VOCAB]
        if len(due) < PARALLEL_ROWS:
            return
        if self._helper is None:
            self._helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fak-sample")

        def draw(part: list[tuple[Lane, np.ndarray]]) -> None:
            for lane, row in part:
                lane.presampled = sample(row, lane.request.sampling, lane.rng, lane.generated, lane.prompt_ids)

        half = len(due) // 2
        other = self._helper.submit(draw, due[half:])
        draw(due[:half])
        other.result()
        self.profile.mark("sample")

    def close(self) -> None:
        if self._helper is not None:
            self._helper.shutdown(wait=True)
            self._helper = None

    def after_prefill(self, lane: Lane, ids: list[int], logits: np.ndarray) -> None:
        self.counters["prefill_tokens"] += len(ids)
        s = lane.session
        if self.prefix is not None:
            full = min(s.length, len(lane.prompt_ids)) // self.block_tokens
            self.prefix.insert(lane.prompt_ids, s.kv.blocks, full, lane.request.kv_descriptor,
                               self.planner.row_tail(lane))
        if s.length < len(lane.prompt_ids):
            return
        lane.to(LaneState.DECODING)
        if lane.generated:  # recompute readmission: the prompt is back, now replay the generated ids
            lane.replay = lane.generated[:-1]
        else:
            self._sample_and_emit(lane, logits)

    def after_import(self, lane: Lane, logits: np.ndarray) -> None:
        """A lane whose whole prompt was prefilled elsewhere (admit_prefilled): its full prompt blocks join
        the prefix cache, and its first token is sampled from the prefill's last logits, as after_prefill
        would; no prompt token is counted as prefilled here."""
        if self.prefix is not None:
            full = len(lane.prompt_ids) // self.block_tokens
            self.prefix.insert(lane.prompt_ids, lane.session.kv.blocks, full, lane.request.kv_descriptor)
        lane.to(LaneState.DECODING)
        self._sample_and_emit(lane, logits)

    def after_step(self, lane: Lane, row: np.ndarray) -> None:
        if lane.replay:
            lane.replay.pop(0)  # recompute replay: the token was generated before, its logits are known
        else:
            self._sample_and_emit(lane, row)

    def after_verify(self, lane: Lane, rows: np.ndarray, draft: list[int]) -> int:
        """A decoding lane fed its pending token and a draft of k tokens in one step: `rows` are the k+1
        rows' logits. Each row is sampled in turn exactly as a one-token step would sample it (same
        logits, same rng draws, same grammar state, same stops); while the emitted token equals the
        drafted one, the next row is the step that would have followed, so it is used too. The first
        mismatch (or a finish) ends it: the positions of the rejected draft tokens are dropped from the
        session (its blocks past the kept positions go back to the pool). Returns the tokens accepted.

        With sampling this is the speculative-sampling rule for a draft that is one token for sure
        (q(d) = 1): accept d with probability p(d), else take a token from p without d, i.e. a token
        drawn from p. Drawing from p and comparing is that rule, and draws what the unspeculated lane
        would have drawn, so a seeded request gives the same tokens either way."""
        s = lane.session
        base = s.length - len(rows)  # the pending token's position
        s.kv.length = base + 1  # only the pending token is known good; each accepted draft token adds one
        del s.tokens[base + 1:]
        accepted, before = 0, len(lane.generated)
        for i, row in enumerate(rows):
            self._sample_and_emit(lane, row)
            if lane.state is LaneState.FINISHED or i == len(draft) or lane.generated[-1] != draft[i]:
                break
            accepted += 1
            s.kv.length += 1
            s.tokens.append(draft[i])
        if lane.state is not LaneState.FINISHED:
            s.truncate(s.length)  # blocks past the kept positions back to the pool
        c = self.counters
        c["spec_drafted"] += len(draft)
        c["spec_accepted"] += accepted
        c["spec_lane_steps"] += 1
        c["spec_emitted"] += len(lane.generated) - before
        return accepted

    def _sample_and_emit(self, lane: Lane, logits: np.ndarray) -> None:
        k = lane.request.logprobs
        if lane.grammar is not None:
            self._constrained(lane, logits, k)
            return
        token = lane.presampled
        if token is None:
            token = sample(logits, lane.request.sampling, lane.rng, lane.generated, lane.prompt_ids)
        lane.presampled = None
        self.profile.mark("sample")
        self.emit(lane, token, None if k is None else token_logprob(logits, token, k))
        self.profile.mark("emit")

    def _constrained(self, lane: Lane, logits: np.ndarray, k: int | None) -> None:
        """Mask what the grammar forbids (-inf, in place on this lane's row), sample, advance the grammar.
        Logprobs stay those of the raw logits (a copy is kept only when they are asked for)."""
        g = lane.grammar
        raw = logits.copy() if k is not None else logits
        allowed = g.mask(logits)
        self.profile.mark("mask")
        if allowed == 0:  # only the grammar's end is left (a vocabulary without EOS), or a dead end
            if g.accepting:
                self.finish(lane, FinishReason.STOP)
            else:
                self.finish(lane, FinishReason.ERROR, f"grammar allows no token: {g.error or 'dead end'}")
            return
        token = sample(logits, lane.request.sampling, lane.rng, lane.generated, lane.prompt_ids)
        self.profile.mark("sample")
        g.advance(token)
        self.emit(lane, token, None if k is None else token_logprob(raw, token, k))
        if g.done and lane.state is not LaneState.FINISHED:
            self.finish(lane, FinishReason.STOP)  # complete, and nothing may follow
        self.profile.mark("emit")

    def emit(self, lane: Lane, token: int, logprob: TokenLogprob | None = None) -> None:
        t = now()
        if lane.first_token_at is None:
            lane.first_token_at = t
        self.rate.add(t, 1)
        self.counters["tokens"] += 1
        req = lane.request
        if req.stop_on_eos and token in self.eos_ids:
            self.finish(lane, FinishReason.EOS)
            return
        if token in req.stop_ids:
            self.finish(lane, FinishReason.STOP)
            return
        lane.generated.append(token)
        lane.token_times.append(t)  # emitted tokens only: an eos or stop id is never delivered
        lane.pending = token
        piece = lane.text.push(token) if lane.text is not None else ""
        if logprob is not None:
            lane.handle.logprobs.append(logprob)  # before the event, so a reader woken by it finds it
        lane.handle._push(token, piece)
        if lane.text is not None and lane.text.stopped:
            self.finish(lane, FinishReason.STOP)
        elif len(lane.generated) >= req.max_new_tokens:
            self.finish(lane, FinishReason.LENGTH)

    def finish(self, lane: Lane, reason: FinishReason, error: str | None = None) -> None:
        s = lane.session
        if s is not None and s.kv.blocks:
            if self.prefix is not None and error is None:
                # the generated tokens' full blocks too (vLLM caches them as well): a conversation's
                # next turn (prompt + this reply + a new message) prefills only what is new. Those
                # blocks were filled by decode steps, not prefill chunks: with a BLAS prefill the next
                # turn's logits differ from a cold run's in the last bits (2e-6 measured), not its tokens
                full = min(s.length, len(s.tokens)) // self.block_tokens
                rows_from = None if lane.prefilled_elsewhere else self.planner.row_tail(lane)
                self.prefix.insert(s.tokens, s.kv.blocks, full, lane.request.kv_descriptor,
                                   rows_from)  # the prompt's tail chunk and decode rows (a local prompt's)
            s.kv.free()
        lane.session, lane.swap_data, lane.replay, lane.draft = None, None, [], None
        if self.drafter is not None and error is None and not lane.request.tainted and lane.generated:
            self.drafter.finished(lane.request.scope, lane.generated)  # suffix drafts: its own scope only
        self.planner.remove(lane)
        lane.to(LaneState.FINISHED)
        lane.finish_reason, lane.error = reason, error
        self.finished[reason.value] = self.finished.get(reason.value, 0) + 1
        tail = lane.text.finish() if lane.text is not None else ""
        result = lane.result(now())
        lane.handle._set_result(result, tail)
        if self.on_finish is not None:
            try:
                self.on_finish(result)
            except Exception:  # an observer (metrics) must not fail the lane or the loop
                pass


def token_logprob(logits: np.ndarray, token: int, k: int) -> TokenLogprob:
    """log softmax of the raw logits (float64) at `token`, and the k most likely (ties: lower id first).
    One float64 copy worked in place, and a partition for the k (a fresh temporary per operation and an
    argpartition of the negated float64 copy cost 5 ms a token on a 262,144-token vocabulary)."""
    raw = np.asarray(logits)
    m = float(raw.max())
    e = raw.astype(np.float64)
    e -= m
    np.exp(e, out=e)
    lse = m + float(np.log(e.sum()))
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        order = ranked_first(raw, min(k, raw.size))
        top = tuple((int(i), float(np.float64(raw[i]) - lse)) for i in order)
    return TokenLogprob(int(token), float(np.float64(raw[token]) - lse), top)
