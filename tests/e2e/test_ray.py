"""fak's workers on Ray (fak/runtime/ray.py): a 3-node `ray.cluster_utils.Cluster` (1 CPU each, a custom
resource per node so each worker lands on its own node; every link over TCP), Gemma 3 270M.
2 stages + P/D: a prefill and a decode worker whose layers run on 2 stage actors: the same tokens, also
after a stage actor is killed mid-run.

Pipeline: 2 stage actors on nodes 1 and 2 give the single-process greedy tokens for 16 concurrent lanes;
a stage actor killed mid-run is restarted by Ray, the pipeline re-links and recomputes, and every request
completes with the same tokens. P/D: a prefill actor on node 0, decode actors on nodes 1 and 2: the same
tokens; a decode actor killed mid-stream: its requests resume on the other, every one completes with the
same tokens, and the restarted actor rejoins the router."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'fak[ray]'; the test command installs it)")

from engine import load_model  # noqa: E402
from engine.gguf.aliases import resolve_model  # noqa: E402
from engine.pd.head import PDHead  # noqa: E402
from engine.pipeline.partition import PartitionPlan  # noqa: E402
from engine.pipeline.pipeline import remote_pipeline  # noqa: E402
from engine.pipeline.scheduler import PipelinedScheduler  # noqa: E402
from engine.sched.lane import Request  # noqa: E402
from engine.sched.scheduler import NativeScheduler  # noqa: E402
from engine.tokenizer.tokenizer import load_tokenizer  # noqa: E402
from fak.runtime.ray import RayWorkers, pd_specs, stage_specs, supervise_pd  # noqa: E402
from support.sched_helpers import GEMMA_PROMPTS  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.gemma, pytest.mark.timeout(900)]

PROMPTS = GEMMA_PROMPTS
NEW = 24


@pytest.fixture(scope="module")
def cluster():  # type: ignore[no-untyped-def]
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"n0": 1}})
    for i in (1, 2):
        c.add_node(num_cpus=1, resources={f"n{i}": 1})
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def gemma():  # type: ignore[no-untyped-def]
    path = resolve_model("gemma3-270m")
    return str(path), load_model(str(path), resident=True, progress=False), load_tokenizer(str(path))


@pytest.fixture(scope="module")
def want(gemma) -> list[list[int]]:  # type: ignore[no-untyped-def]
    _, model, tok = gemma
    with NativeScheduler(model, tokenizer=tok) as s:
        return [h.result(timeout=300).token_ids for h in [s.admit(Request(p, max_new_tokens=NEW)) for p in PROMPTS]]


def _nodes(workers: RayWorkers) -> list[str]:
    return [h["node"] for h in workers.health()]


def test_two_stage_actors_equal_single_process_and_survive_a_kill(cluster, gemma, want) -> None:  # type: ignore[no-untyped-def]
    path, model, tok = gemma
    plan = PartitionPlan.by_bytes(model, 2)
    workers = RayWorkers(stage_specs(plan.bands), path, resources=[{"n1": 1}, {"n2": 1}])
    pm = remote_pipeline(model, workers.addresses, transport="tcp", rejoin=workers.rejoin, link=workers.link)
    try:
        assert len(set(_nodes(workers))) == 2  # each stage on its own node
        assert [h["layers"] for h in workers.health()] == [list(range(*b)) for b in plan.bands]  # only its band
        with PipelinedScheduler(pm, 2, tokenizer=tok) as s:
            res = [h.result(timeout=300) for h in [s.admit(Request(p, max_new_tokens=NEW)) for p in PROMPTS]]
            assert [r.token_ids for r in res] == want
            hs = [s.admit(Request(p, max_new_tokens=NEW)) for p in PROMPTS]
            for _ in zip(range(3), hs[0].tokens(timeout=300), strict=False):
                pass  # mid-run: tokens are flowing
            workers.kill(1)
            res = [h.result(timeout=600) for h in hs]
            assert [r.error for r in res] == [None] * len(PROMPTS)
            assert [r.token_ids for r in res] == want
            assert workers.restarts == [0, 1] and pm.pipeline.stats["recoveries"] == 1
            assert s.stats().kv_lost > 0
    finally:
        pm.close()
        workers.close()


def test_pd_actors_equal_single_process_and_resume_after_a_decode_kill(cluster, gemma, want) -> None:  # type: ignore[no-untyped-def]
    path, model, tok = gemma
    c = model.config
    workers = RayWorkers(pd_specs(2, {"block_tokens": 16}), path, resources=[{"n0": 1}, {"n1": 1}, {"n2": 1}])
    head = PDHead(workers.addresses[0], workers.addresses[1:], link=workers.link, tokenizer=tok, identity=model.identity,
                  vocab_size=c.vocab_size, context_length=c.context_length, eos_ids=tuple(tok.eos_ids))
    supervise_pd(head, workers)
    try:
        assert len(set(_nodes(workers))) == 3
        res = [h.result(timeout=300) for h in [head.admit(Request(p, max_new_tokens=NEW)) for p in PROMPTS]]
        assert [r.token_ids for r in res] == want
        hs = [head.admit(Request(p, max_new_tokens=NEW)) for p in PROMPTS]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(len(j.generated) >= 3 for j in list(head._jobs.values())):
            time.sleep(0.01)
        busiest = max(head.loads(), key=lambda n: head.loads()[n])
        workers.kill(1 + int(busiest[-1]))
        res = [h.result(timeout=600) for h in hs]
        assert [r.error for r in res] == [None] * len(PROMPTS)
        assert [r.token_ids for r in res] == want
        assert head.counts["down"] == 1 and head.counts["failed_over"] >= 1
        deadline = time.monotonic() + 180  # the supervisor takes the restarted actor back
        while time.monotonic() < deadline and head.counts.get("rejoined", 0) < 1:
            time.sleep(0.2)
        assert head.counts.get("rejoined") == 1 and sorted(head.router.workers) == ["decode-0", "decode-1"]
        after = [h.result(timeout=300) for h in [head.admit(Request(p, max_new_tokens=NEW)) for p in PROMPTS]]
        assert [r.token_ids for r in after] == want
    finally:
        head.close()
        workers.close()


def test_pd_with_a_pipelined_decode_worker_equals_single_process_and_survives_a_stage_kill(  # type: ignore[no-untyped-def]
        cluster, gemma, want) -> None:
    """2 stages + P/D: the prefill worker and a decode worker on node 0, the decode worker's layers on two
    stage actors (nodes 1 and 2): KV frames land in the stages' pools, decode steps go through the stages."""
    path, model, tok = gemma
    c = model.config
    plan = PartitionPlan.by_bytes(model, 2)
    key = {"FAK_PD_KEY": "one cluster key for both groups of actors"}  # the decode actor links to the stage actors
    stages = RayWorkers(stage_specs(plan.bands, "decode-0-"), path, resources=[{"n1": 1}, {"n2": 1}], env=key)
    workers = RayWorkers(pd_specs(1, {"block_tokens": 16}, stage_actors=[stages.actors]), path,
                         resources=[{"n0": 0.5}, {"n0": 0.5}], env=key)
    head = PDHead(workers.addresses[0], workers.addresses[1:], link=workers.link, tokenizer=tok, identity=model.identity,
                  vocab_size=c.vocab_size, context_length=c.context_length, eos_ids=tuple(tok.eos_ids))
    try:
        assert len(set(_nodes(stages) + _nodes(workers))) == 3
        res = [h.result(timeout=300) for h in [head.admit(Request(p, max_new_tokens=NEW)) for p in PROMPTS]]
        assert [r.token_ids for r in res] == want
        deadline = time.monotonic() + 10  # the figures arrive with the worker's next heartbeat
        while time.monotonic() < deadline and head.pd_stats()["decode-0"]["imported"] < len(PROMPTS):
            time.sleep(0.1)
        pd = head.pd_stats()
        assert pd["decode-0"]["prefill_tokens"] == 0 and pd["decode-0"]["imported"] == len(PROMPTS)
        hs = [head.admit(Request(p, max_new_tokens=NEW)) for p in PROMPTS]
        for _ in zip(range(3), hs[0].tokens(timeout=300), strict=False):
            pass
        stages.kill(0)  # the decode worker's first stage dies mid-run; Ray restarts it; the lanes recompute
        res = [h.result(timeout=600) for h in hs]
        assert [r.error for r in res] == [None] * len(PROMPTS)
        assert [r.token_ids for r in res] == want
        assert head.counts["down"] == 0  # the decode worker itself never went away
    finally:
        head.close()
        workers.close()
        stages.close()


def test_no_ray_import_without_ray_flags() -> None:
    import subprocess
    import sys

    code = ("import sys; import commands.main, fak.runtime.boot, engine.pipeline.pipeline, engine.pd.head; "
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
