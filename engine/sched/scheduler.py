"""NativeScheduler: continuous batching over a paged KV cache (one loop thread).

Each loop iteration: take new requests and cancels; let the Planner (engine/sched/plan.py) readmit
preempted lanes, promote waiting ones, plan the step (prefill chunks within a token budget, one token
per decoding lane) and meet the KV budget (evict reclaimable prefix blocks, defer newcomers, preempt
victims); run the prefill chunks and the decode tokens in ONE forward (`forward_batch`: each weight read
once per iteration for every lane); hand the logits to the OutputProcessor (engine/sched/output.py):
mask (constrained lanes, engine/grammar), sample, stream, finish. This file holds the public API, the
loop thread and the model calls.

Numerics: a greedy lane's output never depends on its batch mates, on prefix hits or on preemption.
Chunks end on absolute multiples of `prefill_chunk`; a full chunk runs alone through BLAS
(Session.prefill, ~2x faster per row on long prompts), every other row (a prompt's tail chunk, decode
tokens) through the row-stable kernels of `forward_batch`, and prefix hits are whole chunks, then (when
they reach the prompt's own tail chunk) the tail's blocks that the row-stable kernels filled: so how
each position is computed depends only on its own prompt. Recompute replays generated ids through
decode rows; swap copies bytes. (batch_prefill=False: every chunk is its own Session.prefill.)
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import numpy as np

from engine.errors import EngineError
from engine.model.kv import KVExhausted, KVLost
from engine.model.session import blocks_to_reserve
from engine.sched.api import Topology, model_pipeline
from engine.sched.calls import GrammarHost, run_calls
from engine.sched.draft import SPECULATIVE_MODES, Drafter, LaneDraft
from engine.sched.lane import FinishReason, Handle, Lane, LaneState, Request, TextTracker, now, validate_request
from engine.sched.output import OutputProcessor
from engine.sched.plan import Planner, SchedulerConfig
from engine.sched.prefix_cache import PrefixCache, cache_blocks
from engine.sched.profile import NO_PROFILE, IterationProfile
from engine.sched.stats import SchedStats, snapshot
from engine.sched.step_cost import ZEN4_QWEN, rows_reach
from engine.sched.step_cost import measure as measure_step_costs

T = TypeVar("T")


def _delegate(part: str, name: str) -> property:
    """An attribute of one of the scheduler's parts (self.<part>.<name>), read and written through it."""
    return property(lambda self: getattr(getattr(self, part), name),
                    lambda self, value: setattr(getattr(self, part), name, value))


def _check_speculative(mode: str, spec_tokens: int) -> None:
    if mode not in SPECULATIVE_MODES:
        raise EngineError(f"speculative must be one of {', '.join(SPECULATIVE_MODES)}, got {mode!r}")
    if spec_tokens < 1:
        raise EngineError(f"spec_tokens must be >= 1, got {spec_tokens}")


class NativeScheduler(GrammarHost):
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
        prefix_cache_bytes: int | None = None,
        kv_disk: Any = None,
        batch_prefill: bool = True,
        blas_chunks: bool = True,
        warm: bool = False,
        profile: bool | None = None,
        speculative: str = "off",
        spec_tokens: int = 8,
    ) -> None:
        self.config = SchedulerConfig(max_running=max_running, kv_blocks=kv_blocks, preempt_mode=preempt,
                                      victim_rule=victim, prefill_chunk=prefill_chunk, prefill_budget=prefill_budget)
        from engine.model.scratch import Scratch
        from engine.model.session import Session, forward_batch, step_batch  # the model layer

        self._Session, self._step_batch, self._forward_batch = Session, step_batch, forward_batch
        self._logits = Scratch()  # the mixed step's logits, reused step after step (engine/model/scratch.py)
        # True: prefill chunks ride in the decode step's forward (row-stable kernels, one weight pass per
        # iteration); False: each chunk is its own Session.prefill (BLAS), then one step_batch.
        self.batch_prefill = batch_prefill
        # Full prefill chunks [k*C, (k+1)*C) run alone through Session.prefill (BLAS: ~2x faster per row on
        # long prompts); prefix hits are then rounded down to a multiple of C, so whether a position is
        # computed by BLAS or by the row-stable kernels depends only on its own prompt, never on the
        # cache or the batch.
        self.blas_chunks = batch_prefill and blas_chunks and prefill_chunk % block_tokens == 0
        hit_align = prefill_chunk // block_tokens if self.blas_chunks else 1  # prefix hits: whole chunks
        self.model = model
        self._view = model_pipeline(model)  # (topology, collectors): fixed by the model it runs
        self.numba_threads = numba_threads  # numba's thread count is per thread: applied in the loop thread
        self.tokenizer = tokenizer
        if eos_ids is None:
            eos_ids = tuple(getattr(tokenizer, "eos_ids", ()) or ()) if tokenizer is not None else ()
        self.eos_ids = frozenset(eos_ids)
        self.pool = model.new_pool(kv_blocks, block_tokens)
        # kv_disk: an engine.wire.kv_disk.KVDiskCache for this model and pool layout (the prefix cache's
        # disk tier; KV that survives a restart), built by the caller. Only a pool that holds its own
        # layers can feed it (a pipeline's pool keeps them on its stages).
        if kv_disk is not None and (not prefix_cache or not kv_disk.fits(self.pool)):
            kv_disk.close()
            kv_disk = None
        self.kv_disk = kv_disk
        self.prefix = PrefixCache(self.pool, kv_disk) if prefix_cache else None
        # with a growable pool nothing forces eviction: cap what the prefix cache may keep unreferenced
        self.prefix_cache_blocks = cache_blocks(self.pool, prefix_cache_bytes)

        self._cond = threading.Condition()
        self._intake: list[Lane] = []
        self._calls: list[tuple[Callable[[], Any], Future[Any]]] = []  # see call()
        self._closed = False
        self._seq = itertools.count()
        # counters (loop thread only, shared by the scheduler and the output side); published as SchedStats
        self._c: dict[str, int] = dict.fromkeys(
            ("steps", "tokens", "prefill_tokens", "admitted", "swap", "recompute", "bytes_out", "bytes_in",
             "readmitted", "max_running", "imported", "kv_lost", "spec_drafted", "spec_accepted", "spec_lane_steps",
             "spec_emitted"), 0)
        self.planner = Planner(self.config, self.pool, self.prefix, hit_align=hit_align,
                                   new_session=lambda: self._Session(self.model, pool=self.pool),
                                   batch_prefill=batch_prefill, counters=self._c)
        # profile=True (or FAK_SCHED_PROFILE=1): wall time per loop phase, see engine/sched/profile.py
        if profile is None:
            profile = os.environ.get("FAK_SCHED_PROFILE", "") not in ("", "0")
        self.profile: IterationProfile | None = IterationProfile() if profile else None
        self._prof = self.profile or NO_PROFILE
        self.output = OutputProcessor(self.planner, self.prefix, self.eos_ids, self._c, self._prof)
        # speculative decoding (engine/sched/draft.py): a decoding lane feeds its pending token plus a draft
        # and keeps what the model confirms. In-process models only: a pipeline's stages return one row each
        _check_speculative(speculative, spec_tokens)
        self.spec_tokens = spec_tokens  # kept with speculation off too: set_speculative's default
        self.speculative = speculative if self._view[0].kind == "single" else "off"
        self.drafter = Drafter(self.speculative, spec_tokens) if self.speculative != "off" else None
        self.output.drafter = self.drafter
        self.step_costs = ZEN4_QWEN  # measured at warm-up (on this host, for this model) when drafting
        self.events = self.planner.events  # ("preempt"|"readmit", lane seq, preemption round)
        self._snapshot = SchedStats()
        self._publish()
        # warm=True: the kernels are loaded (warmup) by the thread that will run them, before any request.
        # Why there: each thread that enters a numba parallel region gets its own OpenMP team, and two
        # live teams on 2 cores slow each other (measured on Gemma 270M single-lane decode: 80 tok/s
        # from one thread, 52 when the boot thread had also launched regions). `warmed` is set after.
        self.warmed = threading.Event()
        self.warm_s = 0.0
        self._warm = warm
        self._thread: threading.Thread | None = None
        if not thread and warm:
            self._warmup()
        if thread:
            self._thread = threading.Thread(target=self._loop, name="fak-scheduler", daemon=True)
            self._thread.start()

    # observers of finished requests (called on the loop thread with the LaneResult; metrics)
    on_finish = _delegate("output", "on_finish")
    # the policy lives in self.config, which the Planner reads every iteration (so it may be retuned live)
    max_running = _delegate("config", "max_running")
    kv_blocks = _delegate("config", "kv_blocks")
    preempt_mode = _delegate("config", "preempt_mode")
    victim_rule = _delegate("config", "victim_rule")
    prefill_chunk = _delegate("config", "prefill_chunk")
    prefill_budget = _delegate("config", "prefill_budget")
    # the queues are the Planner's (loop thread only; read by tests and debugging)
    _waiting = _delegate("planner", "waiting")
    _running = _delegate("planner", "running")
    _preempted = _delegate("planner", "preempted")

    # ------------------------------------------------------------------ caller side (any thread)
    def admit(self, request: Request) -> Handle:
        """Queue a request (WAITING) and return its handle; raises EngineError on bad input or after close()."""
        ids = self._validate(request)
        # a grammar compiles here, on the caller's thread: the loop never waits for it, a bad one is an EngineError
        matcher = None if request.grammar is None else self.grammar_compiler().matcher(request.grammar)
        seq = next(self._seq)
        handle = Handle(request, request.request_id or f"req-{seq}", self._request_cancel)
        lane = Lane(request=request, seq=seq, prompt_ids=ids, handle=handle, admitted_at=now(), grammar=matcher)
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

    def admit_prefilled(self, request: Request, blocks: list[int], n_tokens: int, first_logits: np.ndarray,
                        handle: Handle | None = None) -> Handle:
        """Queue a request whose prompt was prefilled elsewhere: `blocks` are in this scheduler's pool (e.g.
        imported from a KV frame, or mapped from its prefix cache), one reference each owned by the caller and
        handed to the lane, holding positions 0..n_tokens-1 = the whole prompt; `first_logits` are the
        prefill's last-position logits. The lane starts decoding at once: its first token is sampled from
        those logits exactly as after a local prefill, and no prompt token is prefilled here.

        `handle`: a handle the caller already gave out (engine/pd: a cluster's), now bound to this lane.
        On an EngineError (bad request, closed scheduler) the blocks stay the caller's."""
        ids = self._validate(request)
        bt = self.pool.block_tokens
        if n_tokens != len(ids) or len(blocks) != -(-n_tokens // bt):
            raise EngineError(f"admit_prefilled: {len(blocks)} blocks for {n_tokens} tokens, the prompt has "
                              f"{len(ids)} tokens ({-(-len(ids) // bt)} blocks of {bt})")
        logits = np.asarray(first_logits, dtype=np.float32).reshape(-1)
        if logits.shape[0] != int(self.model.config.vocab_size):
            raise EngineError(f"admit_prefilled: logits of size {logits.shape[0]}, vocab is {self.model.config.vocab_size}")
        matcher = None if request.grammar is None else self.grammar_compiler().matcher(request.grammar)
        seq = next(self._seq)
        if handle is None:
            handle = Handle(request, request.request_id or f"req-{seq}", self._request_cancel)
        lane = Lane(request=request, seq=seq, prompt_ids=ids, handle=handle, admitted_at=now(), grammar=matcher,
                    imported=(list(blocks), logits), prefilled_elsewhere=True)
        if self.tokenizer is not None:
            lane.text = TextTracker(self.tokenizer, request.stop_strings)
        lane.rng = np.random.default_rng(request.sampling.seed if request.sampling.seed is not None else seq)
        with self._cond:
            if self._closed:
                raise EngineError("scheduler is closed: admit_prefilled() after close()")
            handle._lane = lane  # type: ignore[attr-defined]
            handle._cancel = self._request_cancel
            self._intake.append(lane)
            self._cond.notify()
        return handle

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run fn() on the loop thread between two iterations and return its future.

        For model work outside the lanes (an embedding forward): it runs on the thread that runs every
        other kernel (one OpenMP team, see `warm` above), and decode pauses only for its duration.
        """
        fut: Future[T] = Future()
        with self._cond:
            if self._closed:
                raise EngineError("scheduler is closed: call() after close()")
            self._calls.append((fn, fut))
            self._cond.notify()
        return fut

    def set_speculative(self, mode: str, spec_tokens: int | None = None) -> None:
        """Switch speculative decoding to `mode` (off | ngram | suffix; `spec_tokens`: the longest draft, else
        the current one) between two iterations; lanes in flight go on in the new mode (a draft is proposed
        and verified within one step: none is pending between steps). A drafting mode's step costs are timed
        on the loop thread the first time one is set, if this scheduler warms up (`warm`). A benchmark
        compares the modes on ONE scheduler this way: a scheduler a mode would be a loop thread a mode, each
        with its own OpenMP team, and on 2 cores a second team made every kernel launch wait for a worker's
        wake-up (bench/spec.py: 16-lane decode 163 tok/s with three schedulers, 212 with one)."""
        tokens = spec_tokens if spec_tokens is not None else self.spec_tokens
        _check_speculative(mode, tokens)
        if mode != "off" and self._view[0].kind != "single":
            raise EngineError("speculative decoding needs an in-process model (a pipeline's stages return one row each)")

        def switch() -> None:
            if mode != "off" and self._warm and self.step_costs is ZEN4_QWEN:
                self.step_costs = measure_step_costs(self.model)
            self.speculative, self.spec_tokens = mode, tokens
            self.drafter = Drafter(mode, tokens) if mode != "off" else None
            self.output.drafter = self.drafter

        if self._thread is None:
            switch()
        else:
            self.call(switch).result()

    def _run_calls(self) -> None:
        with self._cond:
            calls, self._calls = self._calls, []
        run_calls(calls)  # the caller gets an exception; the loop goes on

    def _validate(self, r: Request) -> list[int]:
        return validate_request(r, tokenizer=self.tokenizer, vocab_size=int(self.model.config.vocab_size),
                                context_length=int(getattr(self.model.config, "context_length", 0) or 0),
                                kv_blocks=self.kv_blocks, block_tokens=self.pool.block_tokens)

    _grammar_hint = " (pass tokenizer= to the scheduler)"

    def _grammar_vocab(self) -> int:
        return int(self.model.config.vocab_size)

    def _request_cancel(self, handle: Handle) -> None:
        with self._cond:
            handle._lane.cancel_requested = True  # type: ignore[attr-defined]
            self._cond.notify()

    def stats(self) -> SchedStats:
        """The latest snapshot (immutable; published by the loop thread every iteration)."""
        return self._snapshot

    def topology(self) -> Topology:
        """"single", or "pipeline" when the model is a pipeline's head (a P/D decode worker may be one)."""
        return self._view[0]

    def collectors(self) -> list[object]:
        """The fak_pipeline_* collector over a pipelined model, else none (SchedStats is the gateway's)."""
        return self._view[1]

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
        self._run_calls()
        return self._has_work()

    def __enter__(self) -> NativeScheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ loop thread
    def _warmup(self) -> None:
        import time

        from engine.kernels.bitmask import warmup as warm_bitmask
        from engine.model.session import warmup

        t0 = time.perf_counter()
        try:
            warmup(kv_dtype=self.pool.kv_dtype)
            warm_bitmask()
            if self.drafter is not None:
                self.step_costs = measure_step_costs(self.model)
        finally:
            self.warm_s = time.perf_counter() - t0
            self.warmed.set()

    def _loop(self) -> None:
        if self.numba_threads:
            import numba

            numba.set_num_threads(self.numba_threads)
        try:
            if self._warm:
                self._warmup()
            while True:
                with self._cond:
                    while not self._closed and not self._intake and not self._calls and not self._has_work():
                        self._publish()
                        self._cond.wait()
                    if self._closed:
                        return
                    new, self._intake = self._intake, []
                self._guarded_iteration(new)
                if self._calls:
                    self._run_calls()
        finally:
            self._shutdown()

    def _guarded_iteration(self, new: list[Lane]) -> None:
        self._prof.start()
        try:
            self._iteration(new)
        except KVLost:  # a pipeline stage restarted: recompute every lane, keep serving (nothing was advanced)
            self.planner.recompute_all()
        except Exception as e:  # an engine bug or model failure must not kill the loop (nor spin on it):
            sched = self.planner
            for q in (sched.running, sched.preempted, sched.waiting):  # fail every lane, keep serving
                for lane in list(q):
                    self.output.finish(lane, FinishReason.ERROR, f"{type(e).__name__}: {e}")
        self._publish()
        self._prof.mark("publish")

    def _has_work(self) -> bool:
        return self.planner.has_work()

    def _iteration(self, new: list[Lane]) -> None:
        sched = self.planner
        sched.begin([ln for ln in new if ln.imported is None])
        for lane in [ln for ln in new if ln.imported is not None]:
            sched.start_imported(lane)
            _, logits = lane.imported  # type: ignore[misc]
            lane.imported = None
            self.output.after_import(lane, logits)
        for q in (sched.waiting, sched.running, sched.preempted):
            for lane in [ln for ln in q if ln.cancel_requested]:
                self.output.finish(lane, FinishReason.CANCELLED)
        self._prof.mark("intake")
        plan = sched.schedule()
        if plan.failed is not None:
            lane, error = plan.failed
            self.output.finish(lane, FinishReason.ERROR, error)
        prefills, decoders = plan.prefills, plan.decoders
        self._prof.mark("plan")
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
        if self.prefix is not None and self.kv_blocks is None:
            self.prefix.trim(self.prefix_cache_blocks)
        self._prof.mark("prefix")

    # -- model work
    def _mixed_step(self, prefills: list[tuple[Lane, list[int]]], decoders: list[Lane]) -> None:
        """Prefill chunks and one token per decoding lane in ONE forward (row-stable kernels)."""
        decoders = [ln for ln in decoders if ln.state is LaneState.DECODING]
        drafts = self._drafts(decoders, prefills)
        feed = [(ln, [ln.replay[0] if ln.replay else ln.pending, *d]) for ln, d in zip(decoders, drafts, strict=True)]
        batch = prefills + feed
        if not batch:
            return
        self._prof.mark("plan")
        sessions, chunks = [ln.session for ln, _ in batch], [ids for _, ids in batch]
        try:
            rows = [1] * len(prefills) + [len(ids) for _, ids in feed] if any(drafts) else None  # verifications
            logits = self._forward_batch(sessions, chunks, rows, out=self._logits)  # read within this step only
        except KVExhausted:
            return  # budget estimate was short: nothing changed, retry next iteration
        finally:
            self._prof.mark("forward")
        if decoders:
            self._c["steps"] += 1
        for i, (lane, ids) in enumerate(prefills):
            self.output.after_prefill(lane, ids, logits[i])
        # each decoding lane's first row: its pending token's, then its draft's
        firsts = list(itertools.accumulate([1 + len(d) for d in drafts], initial=len(prefills)))[:-1]
        self.output.presample([(lane, logits[at]) for lane, at in zip(decoders, firsts, strict=True)])
        for lane, draft, at in zip(decoders, drafts, firsts, strict=True):
            if draft:
                state = lane.draft  # (finishing drops the lane's drafting state)
                accepted = self.output.after_verify(lane, logits[at:at + 1 + len(draft)], draft)
                self.drafter.verified(state, len(draft), accepted)  # type: ignore[union-attr]
            else:
                self.output.after_step(lane, logits[at])

    def _drafts(self, decoders: list[Lane], prefills: list[tuple[Lane, list[int]]]) -> list[list[int]]:
        """A draft for each decoding lane that can take one (none while replaying a recompute), all dropped
        when a fixed pool has no room for the step's rows with them (the step then runs as it would without)."""
        if self.drafter is None:
            return [[] for _ in decoders]
        drafts: list[list[int]] = []
        for lane in decoders:
            if lane.replay or lane.grammar is not None and lane.grammar.done:
                drafts.append([])
                continue
            if lane.draft is None:
                lane.draft = LaneDraft()
            room = lane.request.max_new_tokens - len(lane.generated) - 1  # the rows that could still be emitted
            scope = None if lane.request.tainted else lane.request.scope
            draft = self.drafter.propose(lane.draft, lane.prompt_ids, lane.generated, scope) if room > 0 else []
            drafts.append(draft[:room])
        if any(drafts):
            drafting = [i for i, d in enumerate(drafts) if d]
            # what the step's rows attend to: a decoding lane's row its whole context, a chunk's rows from
            # where the chunk starts on
            held = [ln.session.length for ln in decoders]
            reach = sum(held) + sum(rows_reach(ln.session.length, len(ids)) for ln, ids in prefills)
            chosen = self.drafter.choose([decoders[i].draft for i in drafting], [drafts[i] for i in drafting],
                                         [len(decoders[i].generated) for i in drafting],
                                         len(decoders) + sum(len(ids) for _, ids in prefills), self.step_costs,
                                         [held[i] for i in drafting], reach, len(decoders) + len(prefills),
                                         sum(held) + sum(ln.session.length for ln, _ in prefills))
            for i, d in zip(drafting, chosen, strict=True):
                drafts[i] = d
        if any(drafts) and not self.pool.growable:
            need = blocks_to_reserve([ln.session for ln, _ in prefills] + [ln.session for ln in decoders],
                                     [len(ids) for _, ids in prefills] + [1 + len(d) for d in drafts])
            if need > self.pool.num_free:
                return [[] for _ in decoders]
        return drafts

    def _prefill(self, lane: Lane, ids: list[int]) -> None:
        self._prof.mark("plan")
        try:
            logits = lane.session.prefill(ids)
            self._prof.mark("forward")
        except KVExhausted:
            return  # budget estimate was short (growable accounting aside): retry next iteration
        except KVLost:
            raise  # every lane recomputes (_guarded_iteration), not just this one fails
        except Exception as e:
            self.output.finish(lane, FinishReason.ERROR, f"prefill failed: {type(e).__name__}: {e}")
            return
        self.output.after_prefill(lane, ids, logits)

    def _decode(self, lanes: list[Lane]) -> None:
        feed = [ln.replay[0] if ln.replay else ln.pending for ln in lanes]
        self._prof.mark("plan")
        try:
            logits = self._step_batch([ln.session for ln in lanes], feed)
            self._prof.mark("forward")
        except KVExhausted:
            return
        self._c["steps"] += 1
        for lane, row in zip(lanes, logits, strict=False):
            self.output.after_step(lane, row)

    def _shutdown(self) -> None:
        with self._cond:
            self._closed = True
            new, self._intake = self._intake, []
            calls, self._calls = self._calls, []
        for _, fut in calls:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(EngineError("scheduler closed"))
        sched = self.planner
        for lane in new:
            if lane.imported is not None:  # never started: its blocks are still the lane's alone
                for b in lane.imported[0]:
                    self.pool.release(b)
                lane.imported = None
        sched.waiting.extend(new)
        for q in (sched.running, sched.preempted, sched.waiting):
            for lane in list(q):
                self.output.finish(lane, FinishReason.CANCELLED, "scheduler closed")
        self.output.close()
        if self.prefix is not None:
            self.prefix.clear()
        if self.kv_disk is not None:
            self.kv_disk.close()  # every queued block on disk before close() returns
        self._publish()

    def _publish(self) -> None:
        sched = self.planner
        self._snapshot = snapshot(
            self._c, self.output.finished, sched.last_victim, self.output.rate.rate(now()), pool=self.pool,
            prefix=self.prefix, running=len(sched.running), waiting=len(sched.waiting) + len(self._intake),
            preempted=len(sched.preempted), kv_blocks=self.kv_blocks, max_running=self.max_running,
            preempt_mode=self.preempt_mode, victim_rule=self.victim_rule, disk=self.kv_disk,
            speculative=getattr(self, "speculative", "off"))
