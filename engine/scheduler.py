"""NativeScheduler: continuous batching over a paged KV cache (one loop thread).

Each loop iteration: take new requests and cancels; readmit preempted lanes (by preemption round, then
admission order), then promote waiting lanes (FIFO, or earliest deadline first) up to max_running;
plan the step (prefill chunks within a token budget, one token per decoding lane); meet the KV budget
(evict reclaimable prefix blocks, defer newcomers, then preempt victims); run the prefill chunks and
the decode tokens in ONE forward (`forward_batch`: each weight read once per iteration for every
lane); sample, stream, finish.

Numerics: a greedy lane's output never depends on its batch mates, on prefix hits or on preemption.
Chunks end on absolute multiples of `prefill_chunk`; a full chunk runs alone through BLAS
(Session.prefill, ~2x faster per row on long prompts), every other row (a prompt's tail chunk, decode
tokens) through the row-stable kernels of `forward_batch`, and prefix hits are whole chunks: so how
each position is computed depends only on its own prompt. Recompute replays generated ids through
decode rows; swap copies bytes. (batch_prefill=False: every chunk is its own Session.prefill.)
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from typing import Any

import numpy as np

from engine.errors import EngineError
from engine.kv import KVExhausted
from engine.lane import FinishReason, Handle, Lane, LaneState, Request, TextTracker, now, validate_request
from engine.preemption import (
    PREEMPT_MODES,
    VICTIM_RULES,
    KVBudget,
    attach,
    choose_victim,
    drop_for_recompute,
    swap_in,
    swap_out,
)
from engine.prefix import PrefixCache, hit_limit, prompt_hashes, waits_for_producer
from engine.sampling import sample
from engine.sched_stats import RateMeter, SchedStats, snapshot


class NativeScheduler:
    def __init__(
        self,
        model: Any,
        *,
        max_running: int = 0,
        kv_blocks: int | None = None,
        block_tokens: int = 16,
        preempt: str = "swap",
        victim: str = "most-recent",
        prefill_chunk: int = 64,
        prefill_budget: int = 256,
        tokenizer: Any = None,
        prefix_cache: bool = True,
        eos_ids: tuple[int, ...] | None = None,
        thread: bool = True,
        numba_threads: int | None = None,
        prefix_cache_blocks: int = 256,
        batch_prefill: bool = True,
        blas_chunks: bool = True,
    ) -> None:
        if max_running < 0:
            raise EngineError(f"max_running must be >= 0 (0 = unbounded), got {max_running}")
        if kv_blocks is not None and kv_blocks < 1:
            raise EngineError(f"kv_blocks must be >= 1, got {kv_blocks}")
        if preempt not in PREEMPT_MODES:
            raise EngineError(f"unknown preempt mode {preempt!r} (known: {', '.join(PREEMPT_MODES)})")
        if victim not in VICTIM_RULES:
            raise EngineError(f"unknown victim rule {victim!r} (known: {', '.join(VICTIM_RULES)})")
        if prefill_chunk < 1:
            raise EngineError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        if prefill_budget < 1:
            raise EngineError(f"prefill_budget must be >= 1, got {prefill_budget}")
        from engine.session import Session, forward_batch, step_batch  # the model layer

        self._Session, self._step_batch, self._forward_batch = Session, step_batch, forward_batch
        # True: prefill chunks ride in the decode step's forward (row-stable kernels, one weight pass per
        # iteration); False: each chunk is its own Session.prefill (BLAS), then one step_batch.
        self.batch_prefill = batch_prefill
        # Full prefill chunks [k*C, (k+1)*C) run alone through Session.prefill (BLAS: ~2x faster per row on
        # long prompts); prefix hits are then rounded down to a multiple of C, so whether a position is
        # computed by BLAS or by the row-stable kernels depends only on its own prompt, never on the
        # cache or the batch.
        self.blas_chunks = batch_prefill and blas_chunks and prefill_chunk % block_tokens == 0
        self._hit_align = prefill_chunk // block_tokens if self.blas_chunks else 1  # prefix hits: whole chunks
        self.model = model
        self.numba_threads = numba_threads  # numba's thread count is per thread: applied in the loop thread
        self.max_running = max_running
        self.preempt_mode, self.victim_rule = preempt, victim
        self.prefill_chunk = prefill_chunk
        self.prefill_budget = prefill_budget  # prompt tokens per iteration, all lanes (decoders wait for them)
        self.tokenizer = tokenizer
        if eos_ids is None:
            eos_ids = tuple(getattr(tokenizer, "eos_ids", ()) or ()) if tokenizer is not None else ()
        self.eos_ids = frozenset(eos_ids)
        self.pool = model.new_pool(kv_blocks, block_tokens)
        self.kv_blocks = kv_blocks
        self.prefix = PrefixCache(self.pool) if prefix_cache else None
        self.budget = KVBudget(self.pool, self.prefix, kv_blocks)
        # with a growable pool nothing forces eviction: cap what the prefix cache may keep unreferenced
        self.prefix_cache_blocks = prefix_cache_blocks

        self._cond = threading.Condition()
        self._intake: list[Lane] = []
        self._closed = False
        self._seq = itertools.count()
        self._waiting: list[Lane] = []
        self._running: list[Lane] = []
        self._preempted: list[Lane] = []
        self._iter_no = 0  # loop iterations: a lane's preemption round is the iteration that evicted it
        # ("preempt"|"readmit", lane seq, preemption round): a bounded trace for debugging and tests
        self.events: deque[tuple[str, int, int]] = deque(maxlen=4096)
        # counters (loop thread only); published as an immutable SchedStats
        self._c: dict[str, int] = dict.fromkeys(
            ("steps", "tokens", "prefill_tokens", "admitted", "swap", "recompute", "bytes_out", "bytes_in",
             "readmitted", "max_running"), 0)
        self._finished: dict[str, int] = {}
        self._last_victim = None
        self._rate = RateMeter()
        self._snapshot = SchedStats()
        self._publish()
        self._thread: threading.Thread | None = None
        if thread:
            self._thread = threading.Thread(target=self._loop, name="fak-scheduler", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ caller side (any thread)
    def admit(self, request: Request) -> Handle:
        """Queue a request (WAITING) and return its handle; raises EngineError on bad input or after close()."""
        ids = self._validate(request)
        seq = next(self._seq)
        handle = Handle(request, request.request_id or f"req-{seq}", self._request_cancel)
        lane = Lane(request=request, seq=seq, prompt_ids=ids, handle=handle, admitted_at=now())
        if self.tokenizer is not None:
            lane.text = TextTracker(self.tokenizer, request.stop_strings)
        lane.rng = np.random.default_rng(request.sampling.seed if request.sampling.seed is not None else seq)
        handle._lane = lane  # type: ignore[attr-defined]
        with self._cond:
            if self._closed:
                raise EngineError("scheduler is closed: admit() after close()")
            self._intake.append(lane)
            self._cond.notify()
        return handle

    def _validate(self, r: Request) -> list[int]:
        return validate_request(r, tokenizer=self.tokenizer, vocab_size=int(self.model.config.vocab_size),
                                context_length=int(getattr(self.model.config, "context_length", 0) or 0),
                                kv_blocks=self.kv_blocks, block_tokens=self.pool.block_tokens)

    def _request_cancel(self, handle: Handle) -> None:
        with self._cond:
            handle._lane.cancel_requested = True  # type: ignore[attr-defined]
            self._cond.notify()

    def stats(self) -> SchedStats:
        """The latest snapshot (immutable; published by the loop thread every iteration)."""
        return self._snapshot

    def close(self, timeout: float | None = 30.0) -> None:
        """Abort every request (finish reason cancelled), stop the loop and join it. Idempotent."""
        with self._cond:
            already = self._closed
            self._closed = True
            self._cond.notify()
        if self._thread is None:
            if not already:
                self._shutdown()
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise EngineError(f"scheduler loop did not stop within {timeout} s")

    def step(self) -> bool:
        """Run one loop iteration in the calling thread (schedulers built with thread=False: tests, replays).

        Returns True while any request is unfinished.
        """
        if self._thread is not None:
            raise EngineError("step() drives a scheduler built with thread=False; this one runs its own loop")
        with self._cond:
            if self._closed:
                raise EngineError("scheduler is closed")
            new, self._intake = self._intake, []
        self._guarded_iteration(new)
        return self._has_work()

    def __enter__(self) -> NativeScheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ loop thread
    def _loop(self) -> None:
        if self.numba_threads:
            import numba

            numba.set_num_threads(self.numba_threads)
        try:
            while True:
                with self._cond:
                    while not self._closed and not self._intake and not self._has_work():
                        self._publish()
                        self._cond.wait()
                    if self._closed:
                        return
                    new, self._intake = self._intake, []
                self._guarded_iteration(new)
        finally:
            self._shutdown()

    def _guarded_iteration(self, new: list[Lane]) -> None:
        try:
            self._iteration(new)
        except Exception as e:  # an engine bug or model failure must not kill the loop (nor spin on it):
            for q in (self._running, self._preempted, self._waiting):  # fail every lane, keep serving
                for lane in list(q):
                    self._finish(lane, FinishReason.ERROR, f"{type(e).__name__}: {e}")
        self._publish()

    def _has_work(self) -> bool:
        return bool(self._running or self._waiting or self._preempted)

    def _iteration(self, new: list[Lane]) -> None:
        self._iter_no += 1
        for lane in new:
            self._c["admitted"] += 1
            self._waiting.append(lane)
        for q in (self._waiting, self._running, self._preempted):
            for lane in [ln for ln in q if ln.cancel_requested]:
                self._finish(lane, FinishReason.CANCELLED)
        self._promote()
        self._c["max_running"] = max(self._c["max_running"], len(self._running))
        chunks, decoders = self._plan()
        chunks, decoders = self._meet_budget(chunks, decoders)
        prefills: list[tuple[Lane, list[int]]] = []
        producing: set[int] = set()  # prefix blocks this iteration's batched chunks will fill
        for lane, end in chunks:
            if lane.state is not LaneState.PREFILLING:
                continue
            if not lane.prefix_checked:
                if self.batch_prefill and self.prefix is not None and \
                        waits_for_producer(self.prefix, lane, producing, self._hit_align):
                    continue
                self._match_prefix(lane)  # may map more (or, after an eviction, less) than planned
                end = min(end, self._chunk_end(lane, lane.session.length))
            if end > lane.session.length:
                prefills.append((lane, lane.prompt_ids[lane.session.length : end]))
                if self.prefix is not None and self.batch_prefill:
                    bt = self.pool.block_tokens
                    producing.update(prompt_hashes(lane, bt)[lane.session.length // bt : end // bt])
        if self.blas_chunks:
            for lane, ids in [(ln, ids) for ln, ids in prefills if len(ids) == self.prefill_chunk]:
                self._prefill(lane, ids)
            prefills = [(ln, ids) for ln, ids in prefills if len(ids) < self.prefill_chunk]
        if self.batch_prefill:
            self._mixed_step(prefills, decoders)
        else:
            for lane, ids in prefills:
                self._prefill(lane, ids)
            decoders = [ln for ln in decoders if ln.state is LaneState.DECODING]
            if decoders:
                self._decode(decoders)
        if self.prefix is not None and self.kv_blocks is None and len(self.prefix) > self.prefix_cache_blocks:
            self.prefix.evict(len(self.prefix) - self.prefix_cache_blocks)

    # -- admission
    def _promote(self) -> None:
        limit = self.max_running or (1 << 30)
        self._preempted.sort(key=lambda ln: (ln.preempt_round, ln.seq))
        while self._preempted and len(self._running) < limit:
            lane = self._preempted[0]
            if self._running and self.budget.owed(lane) > self.budget.headroom(self._running):
                return  # wait for room; preempted lanes go first, so no newcomer either
            if not self._readmit(lane):
                return
        if self._preempted:
            return
        if any(ln.request.deadline is not None for ln in self._waiting):
            self._waiting.sort(key=lambda ln: (ln.request.deadline is None, ln.request.deadline or 0.0, ln.seq))
        while self._waiting and len(self._running) < limit:
            lane = self._waiting[0]
            if self._running and self.budget.owed(lane) > self.budget.headroom(self._running):
                return
            self._waiting.pop(0)
            self._start(lane)

    def _match_prefix(self, lane: Lane) -> None:
        """Map the cached prefix of the lane's prompt into its (empty) session. Done right before the
        lane's first chunk runs, so lanes admitted together still share what the earlier ones cached."""
        lane.prefix_checked = True
        if self.prefix is None:
            return
        blocks = self.prefix.match(lane.prompt_ids, hit_limit(lane), self._hit_align)
        if blocks:
            n = len(blocks) * self.pool.block_tokens
            attach(lane.session, blocks, n)
            lane.session.tokens = list(lane.prompt_ids[:n])
            lane.prefix_hit_tokens += n

    def _start(self, lane: Lane) -> None:
        lane.session = self._Session(self.model, pool=self.pool)
        lane.prefix_checked = False
        lane.to(LaneState.PREFILLING)
        lane.pinned_until = now() + lane.request.pin_ttl
        self._running.append(lane)

    def _readmit(self, lane: Lane) -> bool:
        """Bring the head of the preempted queue back; False (lane stays queued) if its blocks do not fit."""
        if lane.swap_data is not None:
            short = len(lane.swap_data) // self.pool.block_bytes - self.pool.num_free
            if short > 0 and self.prefix is not None:
                self.prefix.evict(short)
            try:
                self._c["bytes_in"] += swap_in(lane, self.pool)
            except KVExhausted:  # not when the headroom check holds; wait rather than fail
                return False
            self._preempted.pop(0)
            lane.to(lane.resume_state)
            lane.pinned_until = now() + lane.request.pin_ttl
            self._running.append(lane)
        else:
            self._preempted.pop(0)
            self._start(lane)
        self._c["readmitted"] += 1
        self.events.append(("readmit", lane.seq, lane.preempt_round))
        return True

    # -- planning and the KV budget
    def _plan(self) -> tuple[list[tuple[Lane, int]], list[Lane]]:
        """Prefill chunks as (lane, end position), ending on absolute multiples of prefill_chunk, within a
        token budget; and the decoding lanes."""
        chunks: list[tuple[Lane, int]] = []
        budget = self.prefill_budget
        # lanes already holding blocks first: a newcomer's chunk never crowds out a half-prefilled lane
        prefilling = [ln for ln in self._running if ln.state is LaneState.PREFILLING]
        prefilling.sort(key=lambda ln: not ln.session.kv.blocks)
        for lane in prefilling:
            start = lane.session.length
            if not lane.prefix_checked and self.prefix is not None:  # expected hit; mapped when the chunk runs
                start = self.prefix.peek(lane.prompt_ids, hit_limit(lane), self._hit_align)[0] * self.pool.block_tokens
            end = self._chunk_end(lane, start)
            if chunks and end - start > budget:
                break
            chunks.append((lane, end))
            budget -= end - start
        decoders = [ln for ln in self._running if ln.state is LaneState.DECODING]
        return chunks, decoders

    def _chunk_end(self, lane: Lane, start: int) -> int:
        return min(len(lane.prompt_ids), (start // self.prefill_chunk + 1) * self.prefill_chunk)

    def _meet_budget(self, chunks: list[tuple[Lane, int]], decoders: list[Lane]
                     ) -> tuple[list[tuple[Lane, int]], list[Lane]]:
        """Make the step's blocks available: evict reclaimable prefix blocks; defer prefill chunks of
        lanes that hold nothing yet (newcomers wait rather than evict); then preempt victims."""
        if self.kv_blocks is None:
            return chunks, decoders
        while True:
            need = sum(ln.session.kv.blocks_needed(end) for ln, end in chunks)
            need += sum(ln.session.kv.blocks_needed(ln.session.length + 1) for ln in decoders)
            avail = self.budget.available()
            if need <= avail:
                break
            empty = [i for i, (ln, _) in enumerate(chunks) if not ln.session.kv.blocks]
            if empty and len(chunks) + len(decoders) > 1:
                chunks.pop(empty[-1])
                continue
            holders = [ln for ln in self._running if ln.session.kv.blocks]
            if len(holders) < 2:  # a lone lane is never preempted: it cannot fit the budget at all
                lane = holders[0] if holders else self._running[0]
                self._finish(lane, FinishReason.ERROR,
                             f"KV budget of {self.kv_blocks} blocks too small for {lane.session.length + 1} tokens")
                return [], []
            self._preempt(holders, f"step needs {need} blocks, {avail} available")
            chunks = [(ln, end) for ln, end in chunks if ln.state is LaneState.PREFILLING]
            decoders = [ln for ln in decoders if ln.state is LaneState.DECODING]
        short = need - self.pool.num_free
        if short > 0 and self.prefix is not None:
            self.prefix.evict(short)
        return chunks, decoders

    def _preempt(self, candidates: list[Lane], reason: str) -> None:
        hits = self.prefix.block_hits if self.prefix is not None else (lambda b: 0)
        v = choose_victim(candidates, self.victim_rule, now(), self.pool.block_bytes, hits,
                          self.preempt_mode, reason)
        lane = next(ln for ln in self._running if ln.seq == v.seq)
        self._running.remove(lane)
        if self.preempt_mode == "swap":
            self._c["bytes_out"] += swap_out(lane, self.pool)
            self._c["swap"] += 1
        else:
            drop_for_recompute(lane)
            self._c["recompute"] += 1
        lane.to(LaneState.PREEMPTED)
        lane.preemptions += 1
        lane.preempt_round = self._iter_no
        self.events.append(("preempt", lane.seq, lane.preempt_round))
        self._preempted.append(lane)
        self._last_victim = v

    # -- model work
    def _mixed_step(self, prefills: list[tuple[Lane, list[int]]], decoders: list[Lane]) -> None:
        """Prefill chunks and one token per decoding lane in ONE forward (row-stable kernels)."""
        decoders = [ln for ln in decoders if ln.state is LaneState.DECODING]
        feed = [(ln, [ln.replay[0] if ln.replay else ln.pending]) for ln in decoders]
        batch = prefills + feed
        if not batch:
            return
        try:
            logits = self._forward_batch([ln.session for ln, _ in batch], [ids for _, ids in batch])
        except KVExhausted:
            return  # budget estimate was short: nothing changed, retry next iteration
        if decoders:
            self._c["steps"] += 1
        for i, (lane, ids) in enumerate(prefills):
            self._after_prefill(lane, ids, logits[i])
        for lane, row in zip(decoders, logits[len(prefills):]):
            self._after_step(lane, row)

    def _prefill(self, lane: Lane, ids: list[int]) -> None:
        try:
            logits = lane.session.prefill(ids)
        except KVExhausted:
            return  # budget estimate was short (growable accounting aside): retry next iteration
        except Exception as e:
            self._finish(lane, FinishReason.ERROR, f"prefill failed: {type(e).__name__}: {e}")
            return
        self._after_prefill(lane, ids, logits)

    def _after_prefill(self, lane: Lane, ids: list[int], logits: np.ndarray) -> None:
        self._c["prefill_tokens"] += len(ids)
        s = lane.session
        if self.prefix is not None:
            full = min(s.length, len(lane.prompt_ids)) // self.pool.block_tokens
            self.prefix.insert(lane.prompt_ids, s.kv.blocks, full)
        if s.length < len(lane.prompt_ids):
            return
        lane.to(LaneState.DECODING)
        if lane.generated:  # recompute readmission: the prompt is back, now replay the generated ids
            lane.replay = lane.generated[:-1]
        else:
            self._emit(lane, sample(logits, lane.request.sampling, lane.rng))

    def _decode(self, lanes: list[Lane]) -> None:
        feed = [ln.replay[0] if ln.replay else ln.pending for ln in lanes]
        try:
            logits = self._step_batch([ln.session for ln in lanes], feed)
        except KVExhausted:
            return
        self._c["steps"] += 1
        for lane, row in zip(lanes, logits):
            self._after_step(lane, row)

    def _after_step(self, lane: Lane, row: np.ndarray) -> None:
        if lane.replay:
            lane.replay.pop(0)  # recompute replay: the token was generated before, its logits are known
        else:
            self._emit(lane, sample(row, lane.request.sampling, lane.rng))

    def _emit(self, lane: Lane, token: int) -> None:
        t = now()
        if lane.first_token_at is None:
            lane.first_token_at = t
        self._rate.add(t, 1)
        self._c["tokens"] += 1
        req = lane.request
        if req.stop_on_eos and token in self.eos_ids:
            self._finish(lane, FinishReason.EOS)
            return
        if token in req.stop_ids:
            self._finish(lane, FinishReason.STOP)
            return
        lane.generated.append(token)
        lane.pending = token
        piece = lane.text.push(token) if lane.text is not None else ""
        lane.handle._push(token, piece)
        if lane.text is not None and lane.text.stopped:
            self._finish(lane, FinishReason.STOP)
        elif len(lane.generated) >= req.max_new_tokens:
            self._finish(lane, FinishReason.LENGTH)

    def _finish(self, lane: Lane, reason: FinishReason, error: str | None = None) -> None:
        if lane.session is not None and lane.session.kv.blocks:
            lane.session.kv.free()
        lane.session, lane.swap_data, lane.replay = None, None, []
        for q in (self._waiting, self._running, self._preempted):
            if lane in q:
                q.remove(lane)
        lane.to(LaneState.FINISHED)
        lane.finish_reason, lane.error = reason, error
        self._finished[reason.value] = self._finished.get(reason.value, 0) + 1
        tail = lane.text.finish() if lane.text is not None else ""
        lane.handle._set_result(lane.result(now()), tail)

    def _shutdown(self) -> None:
        with self._cond:
            self._closed = True
            new, self._intake = self._intake, []
        self._waiting.extend(new)
        for q in (self._running, self._preempted, self._waiting):
            for lane in list(q):
                self._finish(lane, FinishReason.CANCELLED, "scheduler closed")
        if self.prefix is not None:
            self.prefix.clear()
        self._publish()

    def _publish(self) -> None:
        self._snapshot = snapshot(
            self._c, self._finished, self._last_victim, self._rate.rate(now()), pool=self.pool, prefix=self.prefix,
            running=len(self._running), waiting=len(self._waiting) + len(self._intake),
            preempted=len(self._preempted), kv_blocks=self.kv_blocks, max_running=self.max_running,
            preempt_mode=self.preempt_mode, victim_rule=self.victim_rule)
