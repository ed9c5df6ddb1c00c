"""Preemption under a KV block budget: the budget arithmetic, victim rules, swap / recompute mechanics.

Victim rules (a lone running lane is never a candidate; the scheduler guarantees >= 2 lanes):
- most-recent: the latest-admitted running lane (vLLM's rule: the tail of the running queue).
- cost-aware: cost = tokens x (reuse hits + 1) / bytes held; the lowest cost is evicted.
  tokens = positions in KV, reuse hits = prefix-cache hits served by the lane's blocks.
Lanes pinned with an unexpired TTL are skipped by both rules; when every candidate is pinned the
rule applies to all of them (the budget must be met), and the victim record says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.errors import EngineError
from engine.model.kv import BlockPool, export_blocks, import_blocks
from engine.sched.lane import Lane, LaneState
from engine.sched.prefix_cache import PrefixCache

PREEMPT_MODES = ("swap", "recompute")
VICTIM_RULES = ("most-recent", "cost-aware")


@dataclass(frozen=True)
class Victim:
    """Why a lane was preempted (the stats keep the last one)."""

    seq: int
    rule: str
    reason: str
    cost: float | None
    mode: str


class KVBudget:
    """Block arithmetic for admission under a budget (kv_blocks None: growable pool, no budget)."""

    def __init__(self, pool: BlockPool, prefix: PrefixCache | None, kv_blocks: int | None) -> None:
        self.pool, self.prefix, self.kv_blocks = pool, prefix, kv_blocks

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.pool.block_tokens)

    def available(self) -> int:
        """Blocks that can be handed out now: free, plus cached blocks no lane references."""
        return self.pool.num_free + (self.prefix.reclaimable() if self.prefix is not None else 0)

    def footprint(self, lane: Lane) -> int:
        """Blocks a lane holds once it is ready to emit its next token (prompt + replayed tokens + 1)."""
        if lane.swap_data is not None:
            return len(lane.swap_data) // self.pool.block_bytes + 1
        return self.blocks_for(len(lane.prompt_ids) + max(0, len(lane.generated) - 1) + 1)

    def owed(self, lane: Lane) -> int:
        """Blocks a (re)admitted or prefilling lane will still take: its footprint minus blocks it holds
        or will map from the prefix cache (mapping a reclaimable block still takes it off `available`)."""
        if lane.session is not None and (lane.session.kv.blocks or lane.prefix_checked):
            return max(0, self.footprint(lane) - len(lane.session.kv.blocks))
        hit, reclaimable = (0, 0)
        if self.prefix is not None and lane.swap_data is None:
            hit, reclaimable = self.prefix.peek(lane.prompt_ids, len(lane.prompt_ids) - 1, scope=lane.request.scope)
        return self.footprint(lane) - hit + reclaimable

    def headroom(self, running: list[Lane]) -> int:
        """Blocks a newcomer may take: available minus what running lanes are still owed (a prefilling
        lane: the rest of its footprint; a decoding lane: one spare block)."""
        if self.kv_blocks is None:
            return 1 << 30
        owed = sum(self.owed(ln) if ln.state is LaneState.PREFILLING else 1 for ln in running)
        return self.available() - owed


def lane_cost(lane: Lane, block_bytes: int, block_hits: Callable[[int], int]) -> float:
    kv = lane.session.kv
    held = len(kv.blocks) * block_bytes
    if held == 0:
        return 0.0
    hits = sum(block_hits(b) for b in kv.blocks)
    return lane.session.kv.length * (hits + 1) / held


def choose_victim(
    running: list[Lane],
    rule: str,
    now: float,
    block_bytes: int,
    block_hits: Callable[[int], int],
    mode: str,
    reason: str,
) -> Victim:
    if len(running) < 2:
        raise EngineError("a lone running lane is never preempted")
    pool = [ln for ln in running if ln.pinned_until <= now]
    why = reason
    if not pool:
        pool, why = list(running), reason + "; all candidates pinned"
    if rule == "most-recent":
        lane = max(pool, key=lambda ln: ln.seq)
        return Victim(lane.seq, rule, why, None, mode)
    if rule == "cost-aware":
        # lowest cost first; ties go to the most recent lane (least sunk work by admission order)
        costs = {ln.seq: lane_cost(ln, block_bytes, block_hits) for ln in pool}
        lane = min(pool, key=lambda ln: (costs[ln.seq], -ln.seq))
        return Victim(lane.seq, rule, why, costs[lane.seq], mode)
    raise EngineError(f"unknown victim rule {rule!r} (known: {', '.join(VICTIM_RULES)})")


def swap_out(lane: Lane, pool: BlockPool) -> int:
    """Serialize the lane's blocks to host bytes and release them; returns bytes moved."""
    kv = lane.session.kv
    lane.swap_data = export_blocks(pool, kv.blocks)
    lane.swap_length = kv.length
    lane.resume_state = lane.state
    detach(lane.session)
    return len(lane.swap_data)


def swap_in(lane: Lane, pool: BlockPool) -> int:
    """Restore a swapped lane's blocks into fresh pool blocks (may raise KVExhausted, lane untouched)."""
    assert lane.swap_data is not None
    blocks = import_blocks(pool, lane.swap_data)
    attach(lane.session, blocks, lane.swap_length)
    n = len(lane.swap_data)
    lane.swap_data = None
    return n


def drop_for_recompute(lane: Lane) -> None:
    """Release the lane's blocks; readmission replays prompt (prefill) then generated ids (decode)."""
    detach(lane.session)
    lane.session = None
    lane.replay = []


def detach(session: object) -> None:
    """Release a session's blocks and mark it empty (its token list is kept by the caller's lane)."""
    session.kv.free()  # type: ignore[attr-defined]
    _set_length(session, 0)


def attach(session: object, blocks: list[int], length: int) -> None:
    """Give a session pre-filled blocks holding positions 0..length-1 (swap-in, prefix reuse)."""
    kv = session.kv  # type: ignore[attr-defined]
    if kv.blocks:
        raise EngineError("attach to a session that already holds KV blocks")
    kv.blocks = list(blocks)
    kv.length = length
    _set_length(session, length)


def _set_length(session: object, length: int) -> None:
    # Session.length may be a property over kv.length or its own field: keep both in step.
    cls_attr = getattr(type(session), "length", None)
    if not isinstance(cls_attr, property) or cls_attr.fset is not None:
        session.length = length  # type: ignore[attr-defined]
