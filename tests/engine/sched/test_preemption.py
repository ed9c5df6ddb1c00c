"""Preemption: swap and recompute under KV pressure keep outputs unchanged; victim rules; readmission order."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from engine.errors import EngineError
from engine.sched.lane import FinishReason, Handle, Lane, LaneState, Request
from engine.sched.preemption import choose_victim, lane_cost
from engine.sched.scheduler import NativeScheduler
from support.sched_helpers import model, rand_prompt, solo


def _run_pressure(mode: str, victim: str, prefix: bool = True) -> tuple[list, list, NativeScheduler]:
    rng = np.random.default_rng(11)
    prompts = [rand_prompt(rng, int(n)) for n in rng.integers(4, 40, size=8)]
    sched = NativeScheduler(model(), max_running=6, kv_blocks=14, block_tokens=4, preempt=mode, victim=victim,
                            prefill_chunk=16, thread=False, prefix_cache=prefix)
    hs = [sched.admit(Request(p, max_new_tokens=24)) for p in prompts]
    peak = 0
    while sched.step():
        assert sched.pool.num_used <= 14
        peak = max(peak, sched.stats().running)
    assert peak <= 6
    return prompts, [h.result(0) for h in hs], sched


@pytest.mark.parametrize("mode", ["swap", "recompute"])
@pytest.mark.parametrize("victim", ["most-recent", "cost-aware"])
def test_outputs_unchanged_under_pressure(mode: str, victim: str) -> None:
    prompts, results, sched = _run_pressure(mode, victim)
    st = sched.stats()
    n_pre = st.preemptions_swap if mode == "swap" else st.preemptions_recompute
    assert n_pre >= 3 and (st.preemptions_recompute if mode == "swap" else st.preemptions_swap) == 0
    assert st.readmitted == n_pre and st.last_victim is not None and st.last_victim.rule == victim
    if mode == "swap":
        assert st.swap_bytes_out == st.swap_bytes_in > 0
        assert st.swap_bytes_out % sched.pool.block_bytes == 0
    else:
        assert st.swap_bytes_out == 0
    assert sum(r.preemptions for r in results) == n_pre
    for p, r in zip(prompts, results, strict=False):
        assert r.finish_reason is FinishReason.LENGTH
        assert r.token_ids == solo(p, 24, 16)
    sched.close()
    assert sched.pool.num_used == 0


def test_readmission_by_round_then_admission_order() -> None:
    _, _, sched = _run_pressure("recompute", "cost-aware")
    outstanding: list[tuple[int, int]] = []  # (round, seq) of preempted lanes, replayed from the trace
    rounds = set()
    for kind, seq, rnd in sched.events:
        if kind == "preempt":
            outstanding.append((rnd, seq))
            rounds.add(rnd)
        else:
            outstanding.sort()
            assert outstanding.pop(0) == (rnd, seq)
    assert not outstanding and len(rounds) >= 2
    sched.close()


def test_a_corrupted_swap_payload_is_noticed() -> None:
    """The outputs above are a real check: flipping swapped-out KV bytes changes the greedy output."""
    import engine.sched.preemption as pre

    real = pre.export_blocks

    def corrupt(pool, blocks):  # type: ignore[no-untyped-def]
        data = bytearray(real(pool, blocks))
        data[: len(data) // 2] = bytes(len(data) // 2)  # zero every K
        return bytes(data)

    pre.export_blocks = corrupt
    try:
        prompts, results, sched = _run_pressure("swap", "most-recent")
    finally:
        pre.export_blocks = real
    assert any(r.token_ids != solo(p, 24, 16) for p, r in zip(prompts, results, strict=False) if r.preemptions)
    sched.close()


def _lane(seq: int, length: int, blocks: list[int], pinned_until: float = 0.0) -> Lane:
    req = Request([1])
    lane = Lane(req, seq, [1], Handle(req, f"r{seq}", lambda h: None), 0.0, state=LaneState.DECODING)
    lane.session = SimpleNamespace(kv=SimpleNamespace(blocks=blocks, length=length))
    lane.pinned_until = pinned_until
    return lane


def test_victim_rules() -> None:
    hits = {1: 3}.get
    a = _lane(0, 30, [0, 1])  # 2 blocks, block 1 reused 3 times: cost 30 * 4 / 2B
    b = _lane(1, 8, [2])  # cost 8 / B
    c = _lane(2, 20, [3, 4])  # cost 20 / 2B = 10 / B
    bb = 100

    def h(blk: int) -> int:
        return hits(blk, 0)

    assert lane_cost(a, bb, h) == pytest.approx(30 * 4 / 200)
    assert choose_victim([a, b, c], "most-recent", 5.0, bb, h, "swap", "r").seq == 2
    v = choose_victim([a, b, c], "cost-aware", 5.0, bb, h, "swap", "r")
    assert (v.seq, v.cost, v.rule, v.mode) == (1, pytest.approx(0.08), "cost-aware", "swap")
    b.pinned_until, c.pinned_until = 10.0, 10.0  # pinned with unexpired TTL: skipped
    assert choose_victim([a, b, c], "cost-aware", 5.0, bb, h, "swap", "r").seq == 0
    assert choose_victim([a, b, c], "most-recent", 5.0, bb, h, "swap", "r").seq == 0
    assert choose_victim([a, b, c], "cost-aware", 11.0, bb, h, "swap", "r").seq == 1  # TTL expired
    a.pinned_until = 10.0
    v = choose_victim([a, b, c], "cost-aware", 5.0, bb, h, "recompute", "r")
    assert v.seq == 1 and "all candidates pinned" in v.reason
    with pytest.raises(EngineError, match="lone"):
        choose_victim([a], "most-recent", 0.0, bb, h, "swap", "r")


def test_pinned_lane_is_not_preempted_under_pressure() -> None:
    rng = np.random.default_rng(5)
    sched = NativeScheduler(model(), kv_blocks=10, block_tokens=4, preempt="swap", victim="most-recent",
                            thread=False, prefix_cache=False)
    hs = [sched.admit(Request(rand_prompt(rng, 6), max_new_tokens=20)) for _ in range(3)]
    pinned = sched.admit(Request(rand_prompt(rng, 6), max_new_tokens=20, pin_ttl=3600.0))
    while sched.step():
        pass
    assert pinned.result(0).preemptions == 0 and sum(h.result(0).preemptions for h in hs) > 0
    sched.close()


def test_cancel_a_preempted_lane_drops_its_swap() -> None:
    sched = NativeScheduler(model(), kv_blocks=6, block_tokens=4, preempt="swap", thread=False, prefix_cache=False)
    a = sched.admit(Request(list(range(1, 9)), max_new_tokens=12))
    b = sched.admit(Request(list(range(9, 17)), max_new_tokens=12))
    while b.state is not LaneState.PREEMPTED and sched.step():
        pass
    assert b.state is LaneState.PREEMPTED
    b.cancel()
    while sched.step():
        pass
    assert b.result(0).finish_reason is FinishReason.CANCELLED and a.result(0).finish_reason is FinishReason.LENGTH
    assert a.result(0).token_ids == solo(list(range(1, 9)), 12) and sched.pool.num_used == 0
    assert sched.stats().preempted == 0
    sched.close()
