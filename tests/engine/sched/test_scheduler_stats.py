"""Stats snapshot, the Prometheus collector (private registry), and the rich views."""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from rich.console import Console

from engine.sched.lane import Request
from engine.sched.preemption import Victim
from engine.sched.scheduler import NativeScheduler
from engine.sched.stats import RateMeter, SchedCollector, SchedStats
from fak.runtime.views import sched_panel
from support.sched_helpers import model, rand_prompt


def _busy_scheduler() -> NativeScheduler:
    rng = np.random.default_rng(8)
    system = rand_prompt(rng, 8)
    s = NativeScheduler(model(), kv_blocks=16, block_tokens=4, max_running=4, preempt="swap", prefill_chunk=4,
                        victim="cost-aware", thread=False)
    hs = [s.admit(Request(system + rand_prompt(rng, 4), max_new_tokens=16)) for _ in range(4)]
    while s.step():
        pass
    assert all(h.done for h in hs)
    return s


def test_snapshot_counts_what_happened() -> None:
    s = _busy_scheduler()
    st = s.stats()
    assert st is s.stats()  # a published object: reading is free
    assert (st.running, st.waiting, st.preempted, st.admitted) == (0, 0, 0, 4)
    assert st.finished == {"length": 4} and st.tokens_generated == 64
    assert st.preemptions_swap > 0 and st.readmitted == st.preemptions_swap
    assert st.swap_bytes_in == st.swap_bytes_out > 0
    assert st.last_victim is not None and st.last_victim.rule == "cost-aware" and st.last_victim.cost is not None
    assert st.prefix_queries == 4 and st.prefix_hits == 3 and st.prefix_hit_tokens == 24
    assert st.max_blocks == 16 and st.used_blocks == st.cached_blocks == st.reclaimable_blocks
    assert 1 <= st.max_running_observed <= 4 and st.steps > 0
    s.close()


def test_prometheus_collector_exposes_sched_and_preempt_metrics() -> None:
    s = _busy_scheduler()
    reg = CollectorRegistry()
    reg.register(SchedCollector(s.stats))
    text = generate_latest(reg).decode()
    st = s.stats()
    for line in (
        "fak_sched_running 0.0",
        "fak_sched_kv_blocks_max 16.0",
        f"fak_sched_generated_tokens_total {st.tokens_generated}.0",
        f"fak_sched_prefix_hit_tokens_total {st.prefix_hit_tokens}.0",
        f'fak_sched_preempt_total{{mode="swap"}} {st.preemptions_swap}.0',
        'fak_sched_preempt_total{mode="recompute"} 0.0',
        f"fak_sched_preempt_swap_out_bytes_total {st.swap_bytes_out}.0",
        f"fak_sched_preempt_readmitted_total {st.readmitted}.0",
        'fak_sched_finished_total{reason="length"} 4.0',
    ):
        assert line in text, line
    assert 'fak_sched_preempt_last_victim_cost{mode="swap",rule="cost-aware"}' in text
    assert reg.get_sample_value("fak_sched_max_running_observed") == st.max_running_observed
    s.close()


def test_rich_panel_renders_the_numbers() -> None:
    st = SchedStats(running=3, waiting=2, preempted=1, tokens_per_s=41.5, used_blocks=90, max_blocks=100,
                    preemptions_swap=7, swap_bytes_out=3 * 1024 * 1024, prefix_queries=4, prefix_hits=3,
                    prefix_hit_tokens=768, last_victim=Victim(12, "cost-aware", "step needs 5 blocks", 0.25, "swap"))
    con = Console(record=True, width=120)
    con.print(sched_panel(st))
    out = con.export_text()
    for needle in ("3 running", "2 waiting", "1 preempted", "41.5 tok/s", "90/100", "3/4 hits (75%)",
                   "768 tokens reused", "swap 7", "out 3.0 MiB", "lane 12 by cost-aware (swap) · cost 0.25"):
        assert needle in out, needle
    assert "kv on disk" not in out  # no disk tier: no row
    con = Console(record=True, width=120)
    con.print(sched_panel(SchedStats(kv_disk_files=728, kv_disk_bytes=286 << 20, kv_disk_hits=12,
                                     kv_disk_bytes_read=3 << 20, kv_disk_refused=1, kv_disk_enabled=0)))
    out = con.export_text()
    assert "728 blocks, 286.0 MiB · 12 read back (3.0 MiB) · 1 refused · off (write failed)" in out


def test_rate_meter_window() -> None:
    m = RateMeter(window_s=2.0)
    assert m.rate(0.0) == 0.0
    for i in range(11):
        m.add(i * 0.1, 5)
    assert abs(m.rate(1.0) - 50.0) < 1e-9
    assert m.rate(10.0) == 0.0  # idle: stale marks do not report a rate


def test_speculation_counters_reach_metrics_and_the_panel() -> None:
    """fak_spec_* (counts, acceptance, tokens per drafting step) and the panel's row, from a real run."""
    p = rand_prompt(np.random.default_rng(2), 20) * 3
    s = NativeScheduler(model(), prefill_chunk=16, speculative="ngram", thread=False)
    h = s.admit(Request(p, max_new_tokens=40))
    while s.step():
        pass
    assert h.result(0).token_ids
    st = s.stats()
    assert st.speculative == "ngram" and st.spec_drafted >= st.spec_accepted > 0
    reg = CollectorRegistry()
    reg.register(SchedCollector(s.stats))
    text = generate_latest(reg).decode()
    assert f"fak_spec_drafted_total {float(st.spec_drafted)}" in text
    assert f"fak_spec_accepted_total {float(st.spec_accepted)}" in text
    assert f"fak_spec_acceptance {st.spec_accepted / st.spec_drafted}" in text
    assert f"fak_spec_tokens_per_step {st.spec_emitted / st.spec_lane_steps}" in text
    con = Console(record=True, width=160)
    con.print(sched_panel(st))
    out = con.export_text()
    assert f"ngram · {st.spec_accepted}/{st.spec_drafted} drafted tokens kept" in out
    assert SchedStats.from_json(st.to_json()) == st
    off = NativeScheduler(model(), thread=False).stats()
    con = Console(record=True, width=160)
    con.print(sched_panel(off))
    assert "speculative" not in con.export_text()  # no row while it is off
