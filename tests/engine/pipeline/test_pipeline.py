"""Pipeline stages behind the scheduler (engine/pipeline/pipeline.py): 2 and 3 stages over in-process queues,
shared-memory rings and TCP give the single-process greedy tokens for 16 concurrent lanes, also under a
tight KV budget with swap and with recompute preemption (swap moves every stage's blocks); a decode step
moves lanes x hidden x 4 bytes per link plus a header that does not grow with the context; partition
plans are checked; a stage that fails or goes away fails the step, never hangs it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from engine.errors import EngineError
from engine.pipeline.partition import PartitionPlan, layer_bytes
from engine.pipeline.pipeline import local_pipeline, remote_pipeline
from engine.pipeline.stage_node import StageNode
from engine.sched.lane import FinishReason, Request
from engine.sched.scheduler import NativeScheduler
from support.sched_helpers import model, rand_prompt, solo

pytestmark = pytest.mark.timeout(300)
BT, CHUNK = 4, 16


def _reqs(seed: int = 0, n: int = 16, new: int = 16) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [Request(rand_prompt(rng, int(k)), max_new_tokens=new) for k in rng.integers(4, 60, size=n)]


def _run(m: object, reqs: list[Request], **kw: object) -> tuple[list[list[int]], object]:
    with NativeScheduler(m, block_tokens=BT, prefill_chunk=CHUNK, **kw) as s:
        hs = [s.admit(Request(r.prompt, max_new_tokens=r.max_new_tokens)) for r in reqs]
        res = [h.result(timeout=120) for h in hs]
        assert [r.error for r in res] == [None] * len(res)
        return [r.token_ids for r in res], s.stats()


def _pipeline(m: object, plan: PartitionPlan, transport: str) -> tuple[object, list[StageNode]]:
    if transport == "inproc":
        return local_pipeline(m, plan), []  # type: ignore[arg-type]
    nodes = [StageNode(m, lo, hi) for lo, hi in plan.bands]
    return remote_pipeline(m, [f"{n.address[0]}:{n.address[1]}" for n in nodes], transport=transport), nodes  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def want() -> list[list[int]]:
    return _run(model(), _reqs())[0]


@pytest.mark.parametrize("transport", ["inproc", "shm", "tcp"])
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("pressure", [None, "swap", "recompute"])
def test_pipeline_greedy_equals_single_process(want: list[list[int]], transport: str, stages: int,
                                               pressure: str | None) -> None:
    m = model()
    pm, nodes = _pipeline(m, PartitionPlan.by_bytes(m, stages), transport)
    try:
        kw = {} if pressure is None else {"kv_blocks": 40, "max_running": 12, "preempt": pressure}
        got, st = _run(pm, _reqs(), **kw)
        assert got == want
        if pressure == "swap":
            assert st.preemptions_swap >= 3 and st.swap_bytes_out == st.swap_bytes_in > 0  # type: ignore[attr-defined]
            assert st.swap_bytes_out % (2 * m.config.n_layers * BT * m.config.n_kv_heads * m.config.head_dim * 4) == 0  # type: ignore[attr-defined]
        elif pressure == "recompute":
            assert st.preemptions_recompute >= 3 and st.swap_bytes_out == 0  # type: ignore[attr-defined]
        ss = pm.pipeline.stage_stats()  # type: ignore[attr-defined]
        assert [tuple(s["layers"]) for s in ss] == PartitionPlan.by_bytes(m, stages).bands
        assert all(s["steps"] == pm.pipeline.stats["messages"] for s in ss)  # type: ignore[attr-defined]
    finally:
        pm.close()  # type: ignore[attr-defined]
        for n in nodes:
            n.close()


@pytest.mark.parametrize("transport", ["inproc", "tcp"])
def test_decode_step_moves_one_hidden_row_per_lane(transport: str) -> None:
    m = model()
    pm, nodes = _pipeline(m, PartitionPlan.by_bytes(m, 2), transport)
    try:
        rng = np.random.default_rng(4)
        prompts = [rand_prompt(rng, 30) for _ in range(6)]
        with NativeScheduler(pm, block_tokens=BT, prefill_chunk=CHUNK, thread=False) as s:
            hs = [s.admit(Request(p, max_new_tokens=40)) for p in prompts]
            p = pm.pipeline  # type: ignore[attr-defined]
            seen = []
            while s.step():
                if p.last["rows"] == p.last["lanes"] == 6:  # a pure decode step of all six lanes
                    seen.append(dict(p.last))
            assert [h.result(0).token_ids for h in hs] == [solo(q, 40, CHUNK) for q in prompts]
        hidden = m.config.hidden
        assert len(seen) >= 30
        assert all(x["bytes"] == 6 * hidden * 4 for x in seen)  # per link: lanes x hidden x float32
        # the header: a few ints per lane, the same late in the run (positions ~70) as early (~31): no history
        early, late = seen[1]["header_bytes"], seen[-1]["header_bytes"]
        assert late <= early + 6 * 8 and late < 6 * 40 + 200
        ss = p.stage_stats()
        assert ss[0]["bytes_out"] == ss[1]["bytes_in"]  # the stage-to-stage link: hidden rows only
        assert all(x["return_bytes"] == 6 * m.config.vocab_size * 4 for x in seen)  # the last stage: logits back
    finally:
        pm.close()  # type: ignore[attr-defined]
        for n in nodes:
            n.close()


@pytest.mark.parametrize("transport", ["inproc", "shm"])
def test_groups_keep_several_forwards_in_flight_same_tokens(want: list[list[int]], transport: str) -> None:
    from engine.pipeline.scheduler import PipelinedScheduler

    m = model()
    pm, nodes = _pipeline(m, PartitionPlan.by_bytes(m, 3), transport)
    try:
        with PipelinedScheduler(pm, 3, block_tokens=BT, prefill_chunk=CHUNK, kv_blocks=60, preempt="swap") as s:
            hs = [s.admit(Request(r.prompt, max_new_tokens=r.max_new_tokens)) for r in _reqs()]
            res = [h.result(timeout=120) for h in hs]
            assert [r.token_ids for r in res] == want
            assert sorted(s.loads().values()) == [0, 0, 0]
            st = s.stats()
            assert st.admitted == 16 and st.finished == {"length": 16} and st.max_blocks == 60
            assert all(g.stats().admitted > 0 for g in s.groups.values())  # every group took lanes
        p = pm.pipeline  # type: ignore[attr-defined]
        assert p.stats["in_flight_max"] >= 2  # forwards of different groups overlapped in the stages
    finally:
        pm.close()  # type: ignore[attr-defined]
        for n in nodes:
            n.close()


def test_partition_plans_are_checked() -> None:
    m = model()
    assert PartitionPlan.by_bytes(m, 1).bands == [(0, 3)]
    assert PartitionPlan.by_bytes(m, 3).bands == [(0, 1), (1, 2), (2, 3)]
    assert PartitionPlan.at(m, [2]).bands == [(0, 2), (2, 3)]
    for cuts, msg in [([0], "must be in 1..2"), ([3], "must be in 1..2"), ([2, 1], "must increase"),
                      ([1, 1], "must increase")]:
        with pytest.raises(EngineError, match=msg):
            PartitionPlan.at(m, cuts)
    with pytest.raises(EngineError, match="expected 1..3"):
        PartitionPlan.by_bytes(m, 4)
    with pytest.raises(EngineError, match="expected layer indices"):
        PartitionPlan.parse_cuts("9,x")
    assert len(layer_bytes(m)) == 3 and all(b > 0 for b in layer_bytes(m))


def test_by_bytes_balances_uneven_layers() -> None:
    class Fake:
        class config:
            n_layers = 6

        class weights:
            layers = [SimpleNamespace(a=np.zeros(n, np.uint8), b=None) for n in (10, 10, 10, 10, 10, 50)]

    plan = PartitionPlan.by_bytes(Fake, 2, head_last=False)
    sizes = [sum((10, 10, 10, 10, 10, 50)[lo:hi]) for lo, hi in plan.bands]
    assert plan.bands == [(0, 5), (5, 6)] and sizes == [50, 50]
    Fake.weights.layers[-1].a = np.zeros(10, np.uint8)  # six equal layers: cut in the middle
    Fake.weights.output = None
    assert PartitionPlan.by_bytes(Fake, 2).bands == [(0, 3), (3, 6)]
    Fake.weights.output = np.zeros(20, np.uint8)  # an LM head of 2 layers' bytes counts on the last stage
    assert PartitionPlan.by_bytes(Fake, 2).bands == [(0, 4), (4, 6)]


def test_stage_failure_fails_the_step_not_hangs() -> None:
    m = model()
    pm, nodes = _pipeline(m, PartitionPlan.by_bytes(m, 2), "tcp")
    try:
        with NativeScheduler(pm, block_tokens=BT, prefill_chunk=CHUNK) as s:
            ok = s.admit(Request([1, 2, 3, 4, 5], max_new_tokens=3)).result(timeout=60)
            assert ok.finish_reason is FinishReason.LENGTH
            nodes[1].close()  # the second stage goes away
            r = s.admit(Request([1, 2, 3, 4, 5, 6], max_new_tokens=3)).result(timeout=60)
            assert r.finish_reason is FinishReason.ERROR and "stage" in (r.error or "")
    finally:
        pm.close()  # type: ignore[attr-defined]
        for n in nodes:
            n.close()


@pytest.mark.parametrize("transport,victim", [("tcp", 1), ("shm", 0)])
def test_a_replaced_stage_rejoins_and_every_lane_is_recomputed(want: list[list[int]], transport: str,
                                                                victim: int) -> None:
    """What a supervisor (Ray) does: the stage dies mid-run, a new one with the same layers comes up, the
    pipeline re-links, and every lane's KV is recomputed: the same greedy tokens, nothing failed."""
    import threading
    import time

    from engine.pipeline.scheduler import PipelinedScheduler

    m = model()
    plan = PartitionPlan.by_bytes(m, 2)
    nodes = [StageNode(m, lo, hi) for lo, hi in plan.bands]
    replaced: list[StageNode] = []

    def rejoin(i: int, why: str) -> str:
        time.sleep(0.2)  # a restart takes a moment
        replaced.append(StageNode(m, *plan.bands[i]))
        return f"{replaced[-1].address[0]}:{replaced[-1].address[1]}"

    pm = remote_pipeline(m, [f"{n.address[0]}:{n.address[1]}" for n in nodes], transport=transport, rejoin=rejoin)
    try:
        with PipelinedScheduler(pm, 2, block_tokens=BT, prefill_chunk=CHUNK) as s:
            hs = [s.admit(Request(r.prompt, max_new_tokens=r.max_new_tokens)) for r in _reqs()]
            first = next(iter(hs[0].tokens(timeout=60)))  # mid-run: tokens are flowing
            threading.Thread(target=nodes[victim].close).start()
            res = [h.result(timeout=120) for h in hs]
            assert first == want[0][0]
            assert [r.error for r in res] == [None] * 16
            assert [r.token_ids for r in res] == want
            st = s.stats()
            assert st.kv_lost > 0 and pm.pipeline.stats["recoveries"] == 1 and len(replaced) == 1  # type: ignore[attr-defined]
            again = s.admit(Request(_reqs()[3].prompt, max_new_tokens=_reqs()[3].max_new_tokens)).result(timeout=60)
            assert again.token_ids == want[3]  # the new stage serves on
    finally:
        pm.close()  # type: ignore[attr-defined]
        for n in nodes + replaced:
            n.close()


def test_remote_stages_must_cover_the_model_in_order() -> None:
    m = model()
    nodes = [StageNode(m, 0, 1), StageNode(m, 2, 3)]
    try:
        with pytest.raises(EngineError, match="must cover 0:3 in order"):
            remote_pipeline(m, [f"{n.address[0]}:{n.address[1]}" for n in nodes])
    finally:
        for n in nodes:
            n.close()


def test_pipeline_refuses_foreign_pools_and_embeddings() -> None:
    from engine import Session

    m = model()
    pm = local_pipeline(m, PartitionPlan.by_bytes(m, 2))
    try:
        with pytest.raises(EngineError, match="one of its own pools"):
            Session(pm, pool=m.new_pool(None, BT)).prefill([1, 2, 3])
        with pytest.raises(EngineError, match="embeddings"):
            pm.embed([1, 2, 3])
    finally:
        pm.close()


def test_pool_calls_across_a_lost_stage_recover_like_a_forward() -> None:
    """A KV import (P/D into a pipelined decode worker) or a swap reaching a stage that went away is the
    pipeline's recovery, as in a forward: the stage rejoins and KVLost is raised (the scheduler recomputes,
    the head re-routes the import), not an error that fails the request. Without a way back: the error."""
    import time

    from engine.model.kv import KVLost

    m = model()
    c = m.config
    plan = PartitionPlan.by_bytes(m, 2)
    nodes = [StageNode(m, lo, hi) for lo, hi in plan.bands]
    replaced: list[StageNode] = []

    def rejoin(i: int, why: str) -> str:
        replaced.append(StageNode(m, *plan.bands[i]))
        return f"{replaced[-1].address[0]}:{replaced[-1].address[1]}"

    kv = np.random.default_rng(0).standard_normal((c.n_layers, 1, BT, c.n_kv_heads, c.head_dim)).astype(np.float32)
    pm = remote_pipeline(m, [f"{n.address[0]}:{n.address[1]}" for n in nodes], rejoin=rejoin)
    try:
        pool = pm.new_pool(8, BT)
        pool.write_kv([0], kv, kv)
        before = pool.read_blocks([0])
        nodes[1].close()  # the second stage goes away
        deadline = time.monotonic() + 10
        while pm.pipeline.stages[1].up and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.01)
        with pytest.raises(KVLost):
            pool.write_kv([1], kv, kv)
        assert pm.pipeline.stats["recoveries"] == 1 and len(replaced) == 1  # type: ignore[attr-defined]
        pool.write_kv([0], kv, kv)  # the new stage takes the frame: the import tried again lands
        assert pool.read_blocks([0]) == before
        pool.copy_block(0, 1)
        assert pool.read_blocks([1]) == before
    finally:
        pm.close()  # type: ignore[attr-defined]
        for n in nodes + replaced:
            n.close()
    nodes = [StageNode(m, lo, hi) for lo, hi in plan.bands]
    pm = remote_pipeline(m, [f"{n.address[0]}:{n.address[1]}" for n in nodes])  # no rejoin
    try:
        pool = pm.new_pool(8, BT)
        nodes[0].close()
        deadline = time.monotonic() + 10
        while pm.pipeline.stages[0].up and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.01)
        with pytest.raises(EngineError, match="pipeline: importing a KV frame") as e:
            pool.write_kv([0], kv, kv)
        assert not isinstance(e.value, KVLost)
    finally:
        pm.close()  # type: ignore[attr-defined]
        for n in nodes:
            n.close()
