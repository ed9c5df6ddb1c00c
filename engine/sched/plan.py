"""Planner: the decisions of one continuous-batching iteration, over lane state (no forward pass).

It owns the queues (waiting, running, preempted) and the KV block budget. Each iteration (vLLM /
nano-vllm's `schedule`):
- promote: readmit preempted lanes (by preemption round, then admission order), then start waiting
  lanes (FIFO, or earliest deadline first) up to max_running, while the budget has room for them;
- plan: prefill chunks ending on absolute multiples of prefill_chunk within a token budget (lanes
  already holding blocks first), and one token per decoding lane;
- meet the KV budget: evict reclaimable prefix blocks, defer newcomers, then preempt victims (swap or
  recompute, engine/sched/preemption.py);
- slice the prompts: a lane's cached prefix is mapped right before its first chunk runs, so lanes
  admitted together still share what the earlier ones cached.
Blocks are mapped, swapped and freed here; the caller (engine/sched/scheduler.py) runs the forward passes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.errors import EngineError
from engine.model.kv import BlockPool, KVExhausted
from engine.sched.lane import Lane, LaneState, now
from engine.sched.preemption import (
    PREEMPT_MODES,
    VICTIM_RULES,
    KVBudget,
    Victim,
    attach,
    choose_victim,
    drop_for_recompute,
    swap_in,
    swap_out,
)
from engine.sched.prefix_cache import PrefixCache, hit_limit, prompt_hashes, row_tail, waits_for_producer


@dataclass
class SchedulerConfig:
    """The scheduling policy, read every iteration; checked on construction (EngineError names the value)."""

    max_running: int = 0  # 0 = unbounded
    kv_blocks: int | None = None  # None: a growable pool, no budget
    preempt_mode: str = "swap"
    victim_rule: str = "most-recent"
    prefill_chunk: int = 64
    prefill_budget: int = 256  # prompt tokens per iteration, all lanes (decoders wait for them)

    def __post_init__(self) -> None:
        if self.max_running < 0:
            raise EngineError(f"max_running must be >= 0 (0 = unbounded), got {self.max_running}")
        if self.kv_blocks is not None and self.kv_blocks < 1:
            raise EngineError(f"kv_blocks must be >= 1, got {self.kv_blocks}")
        if self.preempt_mode not in PREEMPT_MODES:
            raise EngineError(f"unknown preempt mode {self.preempt_mode!r} (known: {', '.join(PREEMPT_MODES)})")
        if self.victim_rule not in VICTIM_RULES:
            raise EngineError(f"unknown victim rule {self.victim_rule!r} (known: {', '.join(VICTIM_RULES)})")
        if self.prefill_chunk < 1:
            raise EngineError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")
        if self.prefill_budget < 1:
            raise EngineError(f"prefill_budget must be >= 1, got {self.prefill_budget}")


@dataclass
class StepPlan:
    """What one iteration runs: prompt chunks as (lane, token ids), then one token per decoding lane."""

    prefills: list[tuple[Lane, list[int]]]
    decoders: list[Lane]
    failed: tuple[Lane, str] | None = None  # a lone lane the whole KV budget cannot hold: finish it (ERROR)


class Planner:
    def __init__(self, config: SchedulerConfig, pool: BlockPool, prefix: PrefixCache | None, *,
                 new_session: Callable[[], Any], hit_align: int, batch_prefill: bool,
                 counters: dict[str, int]) -> None:
        self.config, self.pool, self.prefix = config, pool, prefix
        self.budget = KVBudget(pool, prefix, config.kv_blocks)
        self.new_session = new_session  # an empty Session on the shared pool
        self.hit_align = hit_align  # prefix hits are whole multiples of this many blocks
        self.batch_prefill = batch_prefill
        self.counters = counters  # the caller's loop-thread counters (published in SchedStats)
        self.waiting: list[Lane] = []
        self.running: list[Lane] = []
        self.preempted: list[Lane] = []
        self.iter_no = 0  # loop iterations: a lane's preemption round is the iteration that evicted it
        # ("preempt"|"readmit", lane seq, preemption round): a bounded trace for debugging and tests
        self.events: deque[tuple[str, int, int]] = deque(maxlen=4096)
        self.last_victim: Victim | None = None

    def begin(self, new: list[Lane]) -> None:
        """Start an iteration: newly admitted lanes join the waiting queue."""
        self.iter_no += 1
        for lane in new:
            self.counters["admitted"] += 1
            self.waiting.append(lane)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.preempted)

    def recompute_all(self) -> int:
        """Every lane's KV is gone: running lanes go back to preempted for recompute (prompt + tokens so far
        replayed), swapped ones keep their host copy; the prefix cache forgets its blocks. Returns lanes dropped."""
        dropped = 0
        for lane in list(self.running):
            self.running.remove(lane)
            if lane.session is not None:
                drop_for_recompute(lane)
            lane.to(LaneState.PREEMPTED)
            lane.preemptions += 1
            lane.preempt_round = self.iter_no
            self.preempted.append(lane)
            dropped += 1
        if self.prefix is not None:
            self.prefix.clear()
        self.counters["kv_lost"] = self.counters.get("kv_lost", 0) + dropped
        return dropped

    def remove(self, lane: Lane) -> None:
        for q in (self.waiting, self.running, self.preempted):
            if lane in q:
                q.remove(lane)

    def schedule(self) -> StepPlan:
        """Admit what fits, plan the step and make its KV blocks available."""
        self._promote()
        self.counters["max_running"] = max(self.counters["max_running"], len(self.running))
        chunks, decoders = self._plan()
        chunks, decoders, failed = self._meet_budget(chunks, decoders)
        return StepPlan(self._slice_prompts(chunks), decoders, failed)

    # -- admission
    def _promote(self) -> None:
        limit = self.config.max_running or (1 << 30)
        self.preempted.sort(key=lambda ln: (ln.preempt_round, ln.seq))
        while self.preempted and len(self.running) < limit:
            lane = self.preempted[0]
            if not self._has_room(lane):
                return  # wait for room; preempted lanes go first, so no newcomer either
            if not self._readmit(lane):
                return
        if self.preempted:
            return
        if any(ln.request.deadline is not None for ln in self.waiting):
            self.waiting.sort(key=lambda ln: (ln.request.deadline is None, ln.request.deadline or 0.0, ln.seq))
        while self.waiting and len(self.running) < limit:
            if not self._has_room(self.waiting[0]):
                return
            self._start(self.waiting.pop(0))

    def start_imported(self, lane: Lane) -> None:
        """Run a lane whose prompt KV is already in the pool (admit_prefilled): its session gets the blocks,
        it joins the running lanes at once (its blocks are spent already: neither max_running nor the budget
        holds it back) and the caller samples its first token."""
        assert lane.imported is not None
        blocks, _ = lane.imported
        self.counters["admitted"] += 1
        self.counters["imported"] += 1
        lane.session = self.new_session()
        attach(lane.session, blocks, len(lane.prompt_ids))
        lane.session.tokens = list(lane.prompt_ids)
        lane.prefix_checked = True
        lane.to(LaneState.PREFILLING)
        lane.pinned_until = now() + lane.request.pin_ttl
        self.running.append(lane)

    def _has_room(self, lane: Lane) -> bool:
        """The budget can take the lane's blocks on top of what running lanes are owed (or nothing runs)."""
        return not self.running or self.budget.owed(lane) <= self.budget.headroom(self.running)

    def _start(self, lane: Lane) -> None:
        lane.session = self.new_session()
        lane.prefix_checked = False
        lane.to(LaneState.PREFILLING)
        lane.pinned_until = now() + lane.request.pin_ttl
        self.running.append(lane)

    def _readmit(self, lane: Lane) -> bool:
        """Bring the head of the preempted queue back; False (lane stays queued) if its blocks do not fit."""
        if lane.swap_data is not None:
            short = len(lane.swap_data) // self.pool.block_bytes - self.pool.num_free
            if short > 0 and self.prefix is not None:
                self.prefix.evict(short)
            try:
                self.counters["bytes_in"] += swap_in(lane, self.pool)
            except KVExhausted:  # not when the headroom check holds; wait rather than fail
                return False
            self.preempted.pop(0)
            lane.to(lane.resume_state)
            lane.pinned_until = now() + lane.request.pin_ttl
            self.running.append(lane)
        else:
            self.preempted.pop(0)
            self._start(lane)
        self.counters["readmitted"] += 1
        self.events.append(("readmit", lane.seq, lane.preempt_round))
        return True

    # -- planning and the KV budget
    def _plan(self) -> tuple[list[tuple[Lane, int]], list[Lane]]:
        """Prefill chunks as (lane, end position), ending on absolute multiples of prefill_chunk, within a
        token budget; and the decoding lanes."""
        chunks: list[tuple[Lane, int]] = []
        budget = self.config.prefill_budget
        # lanes already holding blocks first: a newcomer's chunk never crowds out a half-prefilled lane
        prefilling = [ln for ln in self.running if ln.state is LaneState.PREFILLING]
        prefilling.sort(key=lambda ln: not ln.session.kv.blocks)
        for lane in prefilling:
            start = lane.session.length
            if not lane.prefix_checked and self.prefix is not None:  # expected hit; mapped when the chunk runs
                if not lane.disk_checked:  # what memory lacks of the prompt's prefix, brought back from disk
                    lane.disk_checked = True
                    self.prefix.restore(lane.prompt_ids, hit_limit(lane), self.hit_align, lane.request.scope)
                start = self.prefix.peek(lane.prompt_ids, hit_limit(lane), self.hit_align, lane.request.scope,
                                         self.row_tail(lane))[0] * self.pool.block_tokens
            end = self._chunk_end(lane, start)
            if chunks and end - start > budget:
                break
            chunks.append((lane, end))
            budget -= end - start
        decoders = [ln for ln in self.running if ln.state is LaneState.DECODING]
        return chunks, decoders

    def row_tail(self, lane: Lane) -> int | None:
        """The block where the lane's row-stable prompt tail starts (prefix_cache.row_tail)."""
        return row_tail(lane, self.hit_align, self.config.prefill_chunk)

    def _chunk_end(self, lane: Lane, start: int) -> int:
        chunk = self.config.prefill_chunk
        return min(len(lane.prompt_ids), (start // chunk + 1) * chunk)

    def _meet_budget(self, chunks: list[tuple[Lane, int]], decoders: list[Lane]
                     ) -> tuple[list[tuple[Lane, int]], list[Lane], tuple[Lane, str] | None]:
        """Make the step's blocks available: evict reclaimable prefix blocks; defer prefill chunks of
        lanes that hold nothing yet (newcomers wait rather than evict); then preempt victims."""
        kv_blocks = self.config.kv_blocks
        if kv_blocks is None:
            return chunks, decoders, None
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
            holders = [ln for ln in self.running if ln.session.kv.blocks]
            if len(holders) < 2:  # a lone lane is never preempted: it cannot fit the budget at all
                lane = holders[0] if holders else self.running[0]
                return [], [], (lane, f"KV budget of {kv_blocks} blocks too small for {lane.session.length + 1} tokens")
            self._preempt(holders, f"step needs {need} blocks, {avail} available")
            chunks = [(ln, end) for ln, end in chunks if ln.state is LaneState.PREFILLING]
            decoders = [ln for ln in decoders if ln.state is LaneState.DECODING]
        short = need - self.pool.num_free
        if short > 0 and self.prefix is not None:
            self.prefix.evict(short)
        return chunks, decoders, None

    def _preempt(self, candidates: list[Lane], reason: str) -> None:
        prefix, mode = self.prefix, self.config.preempt_mode
        hits = prefix.block_hits if prefix is not None else (lambda b: 0)
        v = choose_victim(candidates, self.config.victim_rule, now(), self.pool.block_bytes, hits, mode, reason)
        lane = next(ln for ln in self.running if ln.seq == v.seq)
        self.running.remove(lane)
        if mode == "swap":
            self.counters["bytes_out"] += swap_out(lane, self.pool)
            self.counters["swap"] += 1
        else:
            drop_for_recompute(lane)
            self.counters["recompute"] += 1
        lane.to(LaneState.PREEMPTED)
        lane.preemptions += 1
        lane.preempt_round = self.iter_no
        self.events.append(("preempt", lane.seq, lane.preempt_round))
        self.preempted.append(lane)
        self.last_victim = v

    # -- prefix sharing
    def _slice_prompts(self, chunks: list[tuple[Lane, int]]) -> list[tuple[Lane, list[int]]]:
        """The planned chunks as prompt token ids. A lane's first chunk maps its cached prefix first (which
        may cover more, or after an eviction less, than planned); with batched prefill, a lane whose next
        prompt block another lane fills in this very forward waits an iteration and maps it instead."""
        prefills: list[tuple[Lane, list[int]]] = []
        producing: set[int] = set()  # prefix blocks this iteration's batched chunks will fill
        for lane, end in chunks:
            if lane.state is not LaneState.PREFILLING:
                continue
            if not lane.prefix_checked:
                if self.batch_prefill and self.prefix is not None and \
                        waits_for_producer(self.prefix, lane, producing, self.hit_align, self.row_tail(lane)):
                    continue
                self._match_prefix(lane)
                end = min(end, self._chunk_end(lane, lane.session.length))
            if end > lane.session.length:
                prefills.append((lane, lane.prompt_ids[lane.session.length : end]))
                if self.prefix is not None and self.batch_prefill and not lane.request.tainted:  # never cached
                    bt = self.pool.block_tokens
                    producing.update(prompt_hashes(lane, bt)[lane.session.length // bt : end // bt])
        return prefills

    def _match_prefix(self, lane: Lane) -> None:
        """Map the cached prefix of the lane's prompt into its (empty) session."""
        lane.prefix_checked = True
        if self.prefix is None:
            return
        blocks = self.prefix.match(lane.prompt_ids, hit_limit(lane), self.hit_align, lane.request.scope,
                                   self.row_tail(lane))
        if blocks:
            n = len(blocks) * self.pool.block_tokens
            attach(lane.session, blocks, n)
            lane.session.tokens = list(lane.prompt_ids[:n])
            lane.prefix_hit_tokens += n
