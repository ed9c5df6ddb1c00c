"""Seeded fuzz of the scheduler: hundreds of random schedules (admits, cancels, budgets, modes, victim
rules, chunk sizes, block sizes, prefix sharing, pins, deadlines) on the synthetic model.

Invariants: every request ends terminal; a greedy lane's tokens equal its solo run (cancelled lanes: a
prefix of it); KV refcounts always equal the holders (lanes + prefix cache); used blocks never exceed
the budget; running never exceeds max_running; zero blocks in use after close.
"""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from engine.sched.lane import FinishReason, Handle, LaneState, Request
from engine.sched.scheduler import NativeScheduler
from support.numba_threads import ParallelLaunches
from support.sched_helpers import model, solo

SYNC_SCHEDULES = 200
THREADED_SCHEDULES = 30


def _config(r: random.Random) -> dict:
    bt = r.choice([2, 4, 8, 16])
    return {
        "max_running": r.choice([0, 1, 2, 3, 5]),
        "block_tokens": bt,
        "kv_blocks": None if r.random() < 0.2 else -(-(r.randint(12, 40) if r.random() < 0.25 else r.randint(30, 90)) // bt),
        "preempt": r.choice(["swap", "recompute"]),
        "victim": r.choice(["most-recent", "cost-aware"]),
        "prefill_chunk": r.choice([4, 8, 16, 64]),
        "prefill_budget": r.choice([4, 16, 64, 256]),
        "prefix_cache": r.random() < 0.7,
        "batch_prefill": r.random() < 0.7,
    }


def _requests(r: random.Random, kv_tokens: int | None) -> list[Request]:
    bases = [[r.randrange(256) for _ in range(r.randint(4, 40))] for _ in range(2)]
    out = []
    for _ in range(r.randint(1, 10)):
        prompt = (r.choice(bases) if r.random() < 0.5 else []) + [r.randrange(256) for _ in range(r.randint(1, 20))]
        new = r.randint(1, 30)
        if kv_tokens is not None:
            # mostly requests that fit the pool alone (pressure comes from concurrency); some do not
            room = kv_tokens if r.random() < 0.9 else kv_tokens + 30
            new = max(1, min(new, room - len(prompt) // 2))
            prompt = prompt[: max(1, min(kv_tokens - 1, room - new))]
        out.append(Request(prompt, max_new_tokens=new,
                           pin_ttl=3600.0 if r.random() < 0.15 else 0.0,
                           deadline=r.uniform(0, 10) if r.random() < 0.2 else None))
    return out


def _check_refcounts(s: NativeScheduler) -> None:
    held: Counter[int] = Counter()
    for lane in s._running:
        held.update(lane.session.kv.blocks)
    if s.prefix is not None:
        held.update(e.block for e in s.prefix._entries.values())
    for lane in s._waiting + s._preempted:
        assert lane.session is None or not lane.session.kv.blocks
    ref = s.pool.refcount
    assert all(int(ref[b]) == n for b, n in held.items())
    assert int(ref.sum()) == sum(held.values())
    assert s.pool.num_used == len(held)


def _check_results(cfg: dict, reqs: list[Request], hs: list[Handle], tag: str, cancelled: set[int],
                   closed_early: bool = False, exact: bool = True) -> None:
    """`cancelled`: indices of the handles the schedule cancelled while unfinished. exact (synchronous:
    a cancel takes effect at the next step): CANCELLED exactly for those. Threaded, a cancel may lose
    the race against the lane's last token, and closing with work in flight cancels the rest."""
    bt = cfg["block_tokens"]
    for i, (req, h) in enumerate(zip(reqs, hs, strict=False)):
        res = h.result(0)
        was_cancelled = res.finish_reason is FinishReason.CANCELLED
        if exact:
            assert was_cancelled == (i in cancelled), f"{tag}: request {i} {res.finish_reason} {req}"
        elif was_cancelled:
            assert i in cancelled or (closed_early and res.error == "scheduler closed"), f"{tag}: request {i} {req}"
        assert h.state is LaneState.FINISHED, tag
        ref = solo(list(req.prompt), req.max_new_tokens, cfg["prefill_chunk"])  # type: ignore[arg-type]
        assert res.token_ids == ref[: len(res.token_ids)], f"{tag}: {req}"
        if res.finish_reason is FinishReason.LENGTH:
            assert len(res.token_ids) == req.max_new_tokens, tag
        elif res.finish_reason is FinishReason.ERROR:  # only a lane that cannot fit the whole pool alone
            assert "KV budget" in (res.error or ""), f"{tag}: {res.error}"
            assert cfg["kv_blocks"] * bt < len(req.prompt) + req.max_new_tokens, tag
        else:
            assert was_cancelled, tag


def _sync_schedule(seed: int) -> dict[str, int]:
    """One random schedule stepped in this thread, checked throughout; its stats."""
    r = random.Random(seed)
    cfg = _config(r)
    kv_tokens = cfg["kv_blocks"] * cfg["block_tokens"] if cfg["kv_blocks"] else None
    reqs = _requests(r, kv_tokens)
    s = NativeScheduler(model(), thread=False, **cfg)
    hs: list[Handle] = []
    cancelled: set[int] = set()
    pending = list(reqs)
    tag = f"seed {seed} {cfg}"
    for _ in range(2000):
        while pending and r.random() < 0.4:
            hs.append(s.admit(pending.pop(0)))
        if hs and r.random() < 0.05:
            i = r.randrange(len(hs))
            if not hs[i].done:
                cancelled.add(i)
            hs[i].cancel()
        busy = s.step()
        st = s.stats()
        assert cfg["max_running"] == 0 or st.running <= cfg["max_running"], tag
        assert cfg["kv_blocks"] is None or st.used_blocks <= cfg["kv_blocks"], tag
        _check_refcounts(s)
        if not busy and not pending:
            break
    assert not pending and all(h.done for h in hs), tag
    st = s.stats()
    s.close()
    assert s.pool.num_used == 0, tag
    assert cfg["max_running"] == 0 or st.max_running_observed <= cfg["max_running"], tag
    _check_results(cfg, reqs, hs, tag, cancelled)
    return {"swap": st.preemptions_swap, "recompute": st.preemptions_recompute,
            "hit_tokens": st.prefix_hit_tokens, **st.finished}


@pytest.mark.slow
def test_fuzz_synchronous_schedules() -> None:
    totals: Counter[str] = Counter()
    with ParallelLaunches() as launches:  # the first 20 schedules (the recorder costs ~1 us a launch)
        for seed in range(20):
            totals.update(_sync_schedule(seed))
    launches.assert_multithreaded("MainThread")  # the kernels ran on several threads
    for seed in range(20, SYNC_SCHEDULES):
        totals.update(_sync_schedule(seed))
    print(dict(totals))
    # the schedules really exercised the machinery
    assert totals["swap"] > 30 and totals["recompute"] > 30 and totals["hit_tokens"] > 500, totals
    assert totals["cancelled"] > 20 and totals["length"] > 400, totals


def test_fuzz_threaded_schedules() -> None:
    with ParallelLaunches() as launches:
        for seed in range(THREADED_SCHEDULES):
            _threaded_schedule(seed)
    launches.assert_multithreaded("fak-scheduler")


def _threaded_schedule(seed: int) -> None:
    r = random.Random(10_000 + seed)
    cfg = _config(r)
    kv_tokens = cfg["kv_blocks"] * cfg["block_tokens"] if cfg["kv_blocks"] else None
    reqs = _requests(r, kv_tokens)
    s = NativeScheduler(model(), **cfg)
    hs = []
    cancelled: set[int] = set()
    for req in reqs:
        hs.append(s.admit(req))
        if r.random() < 0.3:
            time.sleep(r.uniform(0, 0.003))
        if r.random() < 0.1:
            i = r.randrange(len(hs))
            cancelled.add(i)
            hs[i].cancel()
    closed_early = r.random() < 0.3
    if closed_early:  # close with work in flight: everything still ends terminal
        s.close()
    for h in hs:
        h.result(timeout=60)
    st = s.stats()
    s.close()
    assert s.pool.num_used == 0
    assert cfg["max_running"] == 0 or st.max_running_observed <= cfg["max_running"]
    _check_results(cfg, reqs, hs, f"threaded seed {seed} {cfg}", cancelled, closed_early, exact=False)
