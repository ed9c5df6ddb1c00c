"""Pipeline stages on the real Gemma 3 270M (resident weights): 2 and 3 stages, in-process, over shared
memory and over TCP, with several groups of lanes in flight, give the single-process greedy tokens for 16
concurrent lanes, also under a tight KV budget with swap and with recompute preemption."""

from __future__ import annotations

import pytest

from engine import load_model
from engine.gguf.aliases import resolve_model
from engine.pipeline.partition import PartitionPlan
from engine.pipeline.pipeline import local_pipeline, remote_pipeline
from engine.pipeline.scheduler import PipelinedScheduler
from engine.pipeline.stage_node import StageNode
from engine.sched.lane import Request
from engine.sched.scheduler import NativeScheduler
from engine.tokenizer.tokenizer import load_tokenizer
from support.sched_helpers import GEMMA_PROMPTS

pytestmark = [pytest.mark.gemma, pytest.mark.timeout(600), pytest.mark.slow]

PROMPTS = GEMMA_PROMPTS
NEW = 10


@pytest.fixture(scope="module")
def gemma():  # type: ignore[no-untyped-def]
    from engine.tokenizer import tokenizer as T

    path = resolve_model("gemma3-270m")
    yield load_model(str(path), resident=True, progress=False), load_tokenizer(str(path))
    T.clear_memo()


NEW_PRESSED = 40  # lanes grow to 3 blocks each: a budget of 6 blocks a group must preempt, whatever the timing


@pytest.fixture(scope="module")
def want(gemma) -> dict[int, list[list[int]]]:  # type: ignore[no-untyped-def]
    model, tok = gemma
    with NativeScheduler(model, tokenizer=tok) as s:
        return {n: [h.result(timeout=300).token_ids for h in [s.admit(Request(p, max_new_tokens=n)) for p in PROMPTS]]
                for n in (NEW, NEW_PRESSED)}


@pytest.mark.parametrize("stages,transport,pressure", [(2, "inproc", None), (3, "inproc", "swap"),
                                                       (2, "inproc", "recompute"), (2, "shm", "recompute"),
                                                       (3, "shm", "swap"), (3, "tcp", None), (2, "tcp", "swap"),
                                                       (3, "tcp", "recompute")])
def test_gemma_pipeline_equals_single_process(gemma, want, stages: int, transport: str,  # type: ignore[no-untyped-def]
                                              pressure: str | None) -> None:
    model, tok = gemma
    plan = PartitionPlan.by_bytes(model, stages)
    nodes = []
    if transport == "inproc":
        pm = local_pipeline(model, plan)
    else:
        nodes = [StageNode(model, lo, hi) for lo, hi in plan.bands]
        pm = remote_pipeline(model, [f"{n.address[0]}:{n.address[1]}" for n in nodes], transport=transport)
    kw = {} if pressure is None else {"kv_blocks": 2 * 6, "preempt": pressure}  # 6 blocks a group
    new = NEW if pressure is None else NEW_PRESSED
    try:
        with PipelinedScheduler(pm, 2, tokenizer=tok, **kw) as s:
            res = [h.result(timeout=300) for h in [s.admit(Request(p, max_new_tokens=new)) for p in PROMPTS]]
            st = s.stats()
        assert [r.error for r in res] == [None] * len(PROMPTS)
        assert [r.token_ids for r in res] == want[new]
        if pressure == "swap":
            assert st.preemptions_swap > 0 and st.swap_bytes_in == st.swap_bytes_out > 0
        elif pressure == "recompute":
            assert st.preemptions_recompute > 0
        assert plan.bands[0][0] == 0 and plan.bands[-1][1] == model.config.n_layers
    finally:
        pm.close()
        for n in nodes:
            n.close()
