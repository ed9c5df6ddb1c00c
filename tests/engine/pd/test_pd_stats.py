"""P/D statistics: the `fak_pd_*` Prometheus metrics and the rich P/D panel show what `cluster.pd_stats()` says,
after a few requests through a 2-decode-worker cluster (a shared prefix: some blocks skipped, prefix routes)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from rich.console import Console

from engine.pd.cluster import PDCluster
from engine.pd.metrics import PDCollector, decode_workers
from engine.sched.lane import Request
from support.sched_helpers import model, rand_prompt

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def stats() -> dict[str, Any]:
    rng = np.random.default_rng(3)
    system = rand_prompt(rng, 64)  # 4 whole blocks shared by the later requests
    with PDCluster(model(), decode_workers=2, transport="inproc", block_tokens=16, prefill_chunk=64) as c:
        c.admit(Request(system + rand_prompt(rng, 9), max_new_tokens=3)).result(timeout=60)
        time.sleep(0.05)  # the first worker's prefix-cache add events reach the router
        hs = [c.admit(Request(system + rand_prompt(rng, 5 + i), max_new_tokens=4)) for i in range(3)]
        hs += [c.admit(Request(rand_prompt(rng, 40), max_new_tokens=2))]
        for h in hs:
            h.result(timeout=60)
        time.sleep(0.05)
        return c.pd_stats()


def test_prometheus_matches_cluster_stats(stats: dict[str, Any]) -> None:
    reg = CollectorRegistry()
    reg.register(PDCollector(lambda: stats))
    v = reg.get_sample_value
    pre, dec = stats["prefill"], decode_workers(stats)
    assert set(dec) == {"decode-0", "decode-1"}
    assert v("fak_pd_worker", {"worker": "prefill", "role": "prefill"}) == 1
    assert v("fak_pd_requests_total", {"worker": "prefill", "role": "prefill"}) == pre["requests"] == 5
    assert v("fak_pd_prefill_tokens_total", {"worker": "prefill", "role": "prefill"}) == pre["prefill_tokens"]
    assert v("fak_pd_prefill_hit_tokens_total") == pre["hit_tokens"]
    assert v("fak_pd_exported_bytes_total") == pre["bytes_out"]
    assert v("fak_pd_exported_blocks_total") == pre["blocks_out"]
    for name, w in dec.items():
        assert v("fak_pd_worker", {"worker": name, "role": "decode"}) == 1
        assert v("fak_pd_requests_total", {"worker": name, "role": "decode"}) == w["requests"]
        assert v("fak_pd_prefill_tokens_total", {"worker": name, "role": "decode"}) == w["prefill_tokens"] == 0
        for metric, key in [("imports", "imports"), ("import_refused", "refused"), ("blocks_moved", "blocks"),
                            ("bytes_moved", "bytes"), ("blocks_skipped", "skipped_blocks"),
                            ("held_blocks", "held_blocks"), ("transfer_seconds", "transfer_s")]:
            assert v(f"fak_pd_{metric}_total", {"worker": name}) == pytest.approx(w[key]), metric
        mean = w["transfer_s"] / w["imports"] if w["imports"] else 0.0
        assert v("fak_pd_transfer_seconds_mean", {"worker": name}) == pytest.approx(mean)
    assert sum(w["requests"] for w in dec.values()) == 5
    assert sum(w["bytes"] for w in dec.values()) == pre["bytes_out"]  # every exported byte was moved
    assert sum(w["skipped_blocks"] for w in dec.values()) > 0  # the shared prefix stayed resident
    for reason, n in stats["router"].items():
        assert v("fak_pd_routes_total", {"reason": reason}) == n
    assert stats["router"]["prefix"] > 0
    assert b"fak_pd_bytes_moved_total" in generate_latest(reg)


def test_pd_panel_renders_the_numbers(stats: dict[str, Any]) -> None:
    from fak.runtime.views import pd_panel

    con = Console(width=160, record=True, color_system=None)
    con.print(pd_panel(stats))
    out = con.export_text()
    for name, w in decode_workers(stats).items():
        assert name in out
        for key in ("requests", "imports", "blocks", "skipped_blocks"):
            assert f"{w[key]}" in out
    pre = stats["prefill"]
    assert f"{pre['requests']} requests" in out
    assert f"{pre['prefill_tokens']} tokens prefilled" in out
    r = stats["router"]
    assert f"prefix {r['prefix']}" in out and f"least-loaded {r['least-loaded']}" in out
