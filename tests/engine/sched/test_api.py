"""The ServingEngine seam: every facade a server may be handed (one scheduler, pipeline groups, a P/D cluster)
implements it, says how it is split (topology) and brings its own Prometheus families (collectors)."""

from __future__ import annotations

import time
from concurrent.futures import Future

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import engine
from engine.errors import EngineError
from engine.sched.api import ServingEngine, Topology
from engine.sched.lane import Request
from engine.sched.scheduler import NativeScheduler
from engine.sched.stats import SchedStats
from support.sched_helpers import model, rand_prompt


def _families(engine_: ServingEngine) -> set[str]:
    return {f.name for c in engine_.collectors() for f in c.collect()}


def _scraped(engine_: ServingEngine) -> str:
    reg = CollectorRegistry()
    for c in engine_.collectors():
        reg.register(c)
    return generate_latest(reg).decode()


def _serve_one(e: ServingEngine) -> None:
    """The seam works, not just exists: a request streams, call() runs on the engine, stats() and
    on_finish see it."""
    seen: list[object] = []
    e.on_finish = seen.append
    ids = rand_prompt(np.random.default_rng(0), 20)
    r = e.admit(Request(ids, max_new_tokens=4, stop_on_eos=False)).result(timeout=60)
    assert len(r.token_ids) == 4 and r.error is None
    fut = e.call(lambda: 41 + 1)
    assert isinstance(fut, Future) and fut.result(timeout=30) == 42
    deadline = time.monotonic() + 10
    while (not seen or e.stats().tokens_generated < 4) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert isinstance(e.stats(), SchedStats) and e.stats().tokens_generated >= 4 and e.stats().admitted >= 1
    assert [x.request_id for x in seen] == [r.request_id]  # type: ignore[attr-defined]
    with pytest.raises(EngineError, match="needs a tokenizer"):
        e.grammar_compiler()  # no tokenizer here: said, not crashed


def test_native_scheduler_is_single() -> None:
    with NativeScheduler(engine.synthetic_model()) as s:
        assert isinstance(s, ServingEngine)
        t = s.topology()
        assert t == Topology("single") and t.pd is None and t.pipeline is None
        assert s.collectors() == []
    with NativeScheduler(model()) as s:
        _serve_one(s)


def test_topology_kind_is_checked() -> None:
    with pytest.raises(ValueError, match="topology kind"):
        Topology("ring")


def test_pipelined_scheduler_and_a_scheduler_over_a_pipeline_report_it() -> None:
    from engine.pipeline.partition import PartitionPlan
    from engine.pipeline.pipeline import local_pipeline
    from engine.pipeline.scheduler import PipelinedScheduler

    m = model()
    pm = local_pipeline(m, PartitionPlan.by_bytes(m, 2))
    try:
        with PipelinedScheduler(pm, 2) as ps:
            assert isinstance(ps, ServingEngine)
            t = ps.topology()
            assert t.kind == "pipeline" and t.pd is None and t.pipeline is not None
            _serve_one(ps)
            snap = t.pipeline()
            assert len(snap["stages"]) == 2 and snap["head"]["forwards"] > 0
            assert {"fak_pipeline_stages", "fak_pipeline_forwards"} <= _families(ps)
            assert "fak_pipeline_stages 2.0" in _scraped(ps)
        with NativeScheduler(pm) as s:  # e.g. a pipelined P/D decode worker
            t = s.topology()
            assert t.kind == "pipeline" and t.pipeline is not None and len(t.pipeline()["stages"]) == 2
            assert "fak_pipeline_stages" in _families(s)
    finally:
        pm.close()


def test_pd_cluster_is_pd() -> None:
    from engine.pd.cluster import PDCluster

    with PDCluster(model(), decode_workers=2, block_tokens=16, prefill_chunk=64) as c:
        assert isinstance(c, ServingEngine)
        t = c.topology()
        assert t.kind == "pd" and t.pipeline is None and t.pd is not None
        _serve_one(c)
        pd = t.pd()
        assert pd == c.pd_stats() and pd["prefill"]["role"] == "prefill"
        assert sum(pd[f"decode-{i}"]["requests"] for i in range(2)) == 1
        fams = _families(c)
        assert fams and all(f.startswith("fak_pd_") for f in fams) and "fak_pd_worker" in fams
        assert 'fak_pd_worker{role="decode",worker="decode-1"} 1.0' in _scraped(c)
