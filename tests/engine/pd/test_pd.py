"""P/D in one process: decode-side admission of a prefilled prompt (no re-prefill), the prefill and decode
workers, the cache-aware router and the PDCluster: greedy outputs equal a single scheduler's for 1, 2 and 3
decode workers over every transport, a shared system prompt moves only the suffix blocks, scopes never hit
each other's blocks."""

from __future__ import annotations

import time

import numpy as np
import pytest

from engine import Session
from engine.errors import EngineError
from engine.model.session import forward_batch
from engine.pd.cluster import PDCluster
from engine.pd.workers import DecodeWorker, Delivery, PrefillWorker
from engine.sched.lane import FinishReason, Request
from engine.sched.prefix_cache import chain_hashes
from engine.sched.router import Router
from engine.sched.scheduler import NativeScheduler
from engine.sched.trust import KVDescriptor
from engine.wire.frame import FrameError
from support.sched_helpers import model, model_blas, rand_prompt, solo

pytestmark = pytest.mark.timeout(300)
BT, CHUNK = 16, 64


def _mixed(seed: int = 0, n: int = 16) -> list[Request]:
    rng = np.random.default_rng(seed)
    shared = rand_prompt(rng, 70)  # a few share a prefix (prefix hits on both sides)
    reqs = []
    for i in range(n):
        p = rand_prompt(rng, int(rng.integers(3, 180)))
        if i % 4 == 0:
            p = shared + p[:30]
        reqs.append(Request(p, max_new_tokens=int(rng.integers(3, 12)), request_id=f"r{i}"))
    return reqs


def _single(m: object, reqs: list[Request]) -> list[list[int]]:
    with NativeScheduler(m, block_tokens=BT, prefill_chunk=CHUNK) as s:
        hs = [s.admit(r) for r in reqs]
        return [h.result(timeout=120).token_ids for h in hs]


def _idle(c: PDCluster) -> None:
    """Every routed request is accounted finished (on_finish runs right after a handle resolves)."""
    for _ in range(200):
        if c.loads() == dict.fromkeys(c.decoders, 0):
            return
        time.sleep(0.01)
    assert c.loads() == dict.fromkeys(c.decoders, 0)


def test_admit_prefilled_decodes_without_reprefill() -> None:
    m = model()
    rng = np.random.default_rng(1)
    prompt = rand_prompt(rng, 150)
    sched = NativeScheduler(m, block_tokens=BT, prefill_chunk=CHUNK, thread=False)
    s = Session(m, pool=sched.pool)  # a prefill elsewhere, into this pool, on the scheduler's chunk grid
    for i in range(0, len(prompt), CHUNK):
        logits = forward_batch([s], [prompt[i : i + CHUNK]])[0]
    blocks, s.kv.blocks = s.kv.blocks, []
    with pytest.raises(EngineError, match="blocks for"):
        sched.admit_prefilled(Request(prompt, max_new_tokens=6), blocks[:-1], len(prompt), logits)
    h = sched.admit_prefilled(Request(prompt, max_new_tokens=6), blocks, len(prompt), logits)
    while sched.step():
        pass
    r = h.result(timeout=1)
    assert r.token_ids == solo(prompt, 6, CHUNK) and r.finish_reason is FinishReason.LENGTH
    st = sched.stats()
    assert st.prefill_tokens == 0 and st.imported == 1 and st.admitted == 1
    assert st.cached_blocks == len(prompt) // BT  # the prompt's full blocks joined the prefix cache
    sched.close()


@pytest.mark.parametrize("transport,workers,blas", [("inproc", 1, False), ("inproc", 2, False),
                                                    ("inproc", 3, False), ("inproc", 2, True),
                                                    ("shm", 2, False), ("tcp", 3, False)])
def test_cluster_greedy_equals_single_scheduler(transport: str, workers: int, blas: bool) -> None:
    m = model_blas() if blas else model()
    reqs = _mixed()
    want = _single(m, reqs)
    with PDCluster(m, decode_workers=workers, transport=transport, block_tokens=BT, prefill_chunk=CHUNK) as c:
        hs = [c.admit(Request(r.prompt, max_new_tokens=r.max_new_tokens, request_id=r.request_id)) for r in reqs]
        got = [h.result(timeout=120) for h in hs]
        assert [r.error for r in got] == [None] * len(reqs)
        assert [r.token_ids for r in got] == want
        assert [r.request_id for r in got] == [r.request_id for r in reqs]
        st = c.pd_stats()
        decode = [st[f"decode-{i}"] for i in range(workers)]
        assert all(d["prefill_tokens"] == 0 for d in decode)  # nothing re-prefilled on the decode side
        assert sum(d["imported"] for d in decode) == len(reqs) == st["prefill"]["requests"]
        assert sum(d["requests"] > 0 for d in decode) == workers  # every worker took some
        _idle(c)


def test_shared_system_prompt_moves_only_suffix_blocks() -> None:
    m = model()
    rng = np.random.default_rng(2)
    system = rand_prompt(rng, 256)
    a, b = system + rand_prompt(rng, 40), system + rand_prompt(rng, 40)
    with PDCluster(m, decode_workers=2, block_tokens=BT, prefill_chunk=CHUNK) as c:
        ra = c.admit(Request(a, max_new_tokens=5)).result(timeout=60)
        where = next(w for w, mv in c.moved.items() if mv["requests"] == 1)
        first = dict(c.moved[where])
        p0 = c.prefill.stats["prefill_tokens"]
        assert first["blocks"] == -(-len(a) // BT) == 19 and first["skipped_blocks"] == 0
        rb = c.admit(Request(b, max_new_tokens=5)).result(timeout=60)
        assert c.router.counts["prefix"] == 1  # the second request went where the system prompt is
        second = {k: c.moved[where][k] - first[k] for k in first}
        block_bytes = c.decoders[where].sched.pool.block_bytes
        assert second["requests"] == 1 and second["skipped_blocks"] == 16 and second["blocks"] == 3
        assert 3 * block_bytes <= second["bytes"] < 3 * block_bytes + 4096 < first["bytes"]
        assert c.prefill.stats["prefill_tokens"] - p0 == 40  # the prefill worker's own prefix hit
        assert ra.token_ids == solo(a, 5, CHUNK) and rb.token_ids == solo(b, 5, CHUNK)
        assert all(st["prefill_tokens"] == 0 for name, st in c.pd_stats().items() if name.startswith("decode"))


def test_scopes_never_share_resident_blocks() -> None:
    m = model()
    rng = np.random.default_rng(3)
    system = rand_prompt(rng, 256)
    with PDCluster(m, decode_workers=1, block_tokens=BT, prefill_chunk=CHUNK) as c:
        w = c.moved["decode-0"]
        runs = [("a", 0), ("b", 0), ("a", 16), ("", 0)]  # (scope, blocks the decode worker supplies)
        for scope, skipped in runs:
            before = dict(w)
            p = system + rand_prompt(rng, 20)
            r = c.admit(Request(p, max_new_tokens=3, scope=scope)).result(timeout=60)
            assert r.token_ids == solo(p, 3, CHUNK)
            assert w["skipped_blocks"] - before["skipped_blocks"] == skipped, scope
        assert c.router.counts["prefix"] == 1


def _prefill_frame(ids: list[int], desc: KVDescriptor, skip: int = 0) -> tuple[PrefillWorker, object, np.ndarray]:
    pw = PrefillWorker(model(), block_tokens=BT, prefill_chunk=CHUNK, thread=False)
    res = pw.prefill(ids, desc, skip)
    return pw, res.frame, res.logits


def test_frame_of_another_scope_or_prompt_is_refused_pool_unchanged() -> None:
    m = model()
    rng = np.random.default_rng(4)
    ids = rand_prompt(rng, 100)
    w = DecodeWorker(m, block_tokens=BT, prefill_chunk=CHUNK)
    try:
        pool = w.sched.pool
        used = pool.num_used
        _, frame, logits = _prefill_frame(ids, KVDescriptor("tenant-a"))
        for req_ids, scope, why in [(ids, "tenant-b", "descriptor"), (ids, "", "descriptor"),
                                    (ids[:-1] + [(ids[-1] + 1) % 256], "tenant-a", "not this prompt")]:
            with pytest.raises(FrameError, match=why):
                w.deliver(Delivery(Request(req_ids, max_new_tokens=2, scope=scope), req_ids, [], logits), frame)
            assert pool.num_used == used and w.sched.stats().imported == 0
        # the right scope is admitted; the worker then holds the prompt's blocks in that scope only
        h = w.deliver(Delivery(Request(ids, max_new_tokens=4, scope="tenant-a"), ids, [], logits), frame)
        assert h.result(timeout=30).token_ids == solo(ids, 4, CHUNK)
        assert w.held(ids, "tenant-a") == (len(ids) - 1) // BT and w.held(ids, "tenant-b") == w.held(ids) == 0
        assert w.stats["refused"] == 3 and w.sched.stats().prefill_tokens == 0
    finally:
        w.close()


def test_held_blocks_released_when_the_import_fails() -> None:
    m = model()
    rng = np.random.default_rng(5)
    ids = rand_prompt(rng, 90)
    w = DecodeWorker(m, block_tokens=BT, prefill_chunk=CHUNK)
    try:
        _, frame, logits = _prefill_frame(ids, KVDescriptor())
        w.deliver(Delivery(Request(ids, max_new_tokens=2), ids, [], logits), frame).result(timeout=30)
        held = w.reserve(ids)
        assert len(held) == (len(ids) - 1) // BT
        refs = [int(w.sched.pool.refcount[b]) for b in held]
        with pytest.raises(FrameError):  # a frame carrying every block, but the worker supplies some
            w.deliver(Delivery(Request(ids, max_new_tokens=2), ids, held, logits), frame)
        assert [int(w.sched.pool.refcount[b]) for b in held] == [r - 1 for r in refs]
        _, rest, logits = _prefill_frame(ids, KVDescriptor(), len(held))
        held = w.reserve(ids)
        h = w.deliver(Delivery(Request(ids, max_new_tokens=5), ids, held, logits), rest)
        assert h.result(timeout=30).token_ids == solo(ids, 5, CHUNK) and w.sched.stats().prefill_tokens == 0
    finally:
        w.close()


def test_router_longest_prefix_then_least_loaded_under_imbalance() -> None:
    r = Router(["w0", "w1", "w2"], balance_abs=4, balance_rel=1.5)
    toks = list(range(160))
    hs = chain_hashes(toks, BT, 9)
    r.publish("w1", "add", hs[:4])
    r.publish("w2", "add", hs[:7])
    idle = {"w0": 0, "w1": 0, "w2": 0}
    assert (r.route(hs, idle).worker, r.route(hs, idle).matched) == ("w2", 7)
    assert r.route(hs, {"w0": 2, "w1": 1, "w2": 5}).reason == "prefix"  # 5 - 1 <= 4: not imbalanced
    rt = r.route(hs, {"w0": 3, "w1": 1, "w2": 9})  # 9 - 1 > 4 and 9 > 1.5: least loaded
    assert (rt.worker, rt.reason) == ("w1", "balance")
    assert r.route(chain_hashes(toks, BT, 9, "other-scope"), {"w0": 1, "w1": 0, "w2": 0}).reason == "least-loaded"
    assert r.route(chain_hashes([999] + toks[1:], BT, 9), idle).reason == "least-loaded"  # another first block
    r.publish("w2", "evict", hs[2:3])
    assert r.route(hs, idle).worker == "w1"  # w2 now holds only 2 leading blocks
    r.forget("w1")  # a lost view (restart, lost events): a cold route, never a wrong one
    assert r.route(hs, {"w0": 0, "w1": 1, "w2": 2}).worker == "w2"
    r.publish("gone", "add", hs)  # an unknown worker's event is ignored
    assert r.counts == {"prefix": 5, "least-loaded": 2, "balance": 1}


def test_cluster_cancel_and_bad_requests() -> None:
    m = model()
    with PDCluster(m, decode_workers=2, block_tokens=BT, prefill_chunk=CHUNK) as c:
        with pytest.raises(EngineError, match="empty prompt"):
            c.admit(Request([], max_new_tokens=2))
        rng = np.random.default_rng(6)
        hs = [c.admit(Request(rand_prompt(rng, 60), max_new_tokens=200)) for _ in range(3)]
        for h in hs:
            h.cancel()
        rs = [h.result(timeout=60) for h in hs]
        assert all(r.finish_reason in (FinishReason.CANCELLED, FinishReason.LENGTH) for r in rs)
        assert any(r.finish_reason is FinishReason.CANCELLED for r in rs)
        _idle(c)
    with pytest.raises(EngineError, match="closed"):
        c.admit(Request([1, 2, 3]))


def test_fixed_decode_budget_waits_for_room_and_stays_exact() -> None:
    """Decode workers with a small fixed KV pool: a frame waits for room (lanes finish, prefix blocks are
    evicted, swaps free blocks) instead of failing, and greedy outputs are unchanged."""
    m = model()
    rng = np.random.default_rng(7)
    reqs = [Request(rand_prompt(rng, int(rng.integers(20, 150))), max_new_tokens=30) for _ in range(16)]
    want = _single(m, reqs)
    with PDCluster(m, decode_workers=2, block_tokens=BT, prefill_chunk=CHUNK, kv_blocks=16) as c:
        got = [h.result(timeout=120) for h in [c.admit(r) for r in reqs]]
        assert [r.error for r in got] == [None] * len(reqs)
        assert [r.token_ids for r in got] == want
        st = c.pd_stats()
        assert all(st[w]["refused"] == 0 for w in c.decoders)
        scheds = [w.sched.stats() for w in c.decoders.values()]
        assert all(s.prefill_tokens == 0 for s in scheds)  # swap preemption: nothing recomputed either


def test_frame_waits_for_room_in_a_fixed_pool() -> None:
    m = model()
    rng = np.random.default_rng(8)
    a, b = rand_prompt(rng, 100), rand_prompt(rng, 90)  # 7 and 6 blocks; the pool has 12
    w = DecodeWorker(m, block_tokens=BT, prefill_chunk=CHUNK, kv_blocks=12, prefix_cache=False)
    try:
        _, fa, la = _prefill_frame(a, KVDescriptor())
        _, fb, lb = _prefill_frame(b, KVDescriptor())
        ha = w.deliver(Delivery(Request(a, max_new_tokens=60), a, [], la), fa)
        hb = w.deliver(Delivery(Request(b, max_new_tokens=5), b, [], lb), fb)  # waits for a to finish
        assert w.stats["import_waits"] > 0 and ha.done
        assert ha.result(timeout=30).token_ids == solo(a, 60, CHUNK)
        assert hb.result(timeout=30).token_ids == solo(b, 5, CHUNK)
    finally:
        w.close()


def test_prefill_failure_fails_the_request_never_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    m = model()
    with PDCluster(m, decode_workers=2, block_tokens=BT, prefill_chunk=CHUNK) as c:
        def boom(*a: object, **k: object) -> None:
            raise RuntimeError("prefill worker down")

        monkeypatch.setattr(c.prefill, "prefill", boom)
        r = c.admit(Request([1, 2, 3, 4], max_new_tokens=3)).result(timeout=30)
        assert r.finish_reason is FinishReason.ERROR and "prefill worker down" in (r.error or "")
        _idle(c)
        assert all(w.sched.stats().used_blocks == 0 for w in c.decoders.values())  # held blocks released


def test_tainted_span_is_never_resident_for_others() -> None:
    m = model()
    rng = np.random.default_rng(9)
    system = rand_prompt(rng, 256)
    with PDCluster(m, decode_workers=1, block_tokens=BT, prefill_chunk=CHUNK) as c:
        w = c.moved["decode-0"]
        p = system + rand_prompt(rng, 20)
        r = c.admit(Request(p, max_new_tokens=3, tainted=True, verdict="QUARANTINE")).result(timeout=60)
        assert r.token_ids == solo(p, 3, CHUNK)
        q = system + rand_prompt(rng, 20)
        assert c.admit(Request(q, max_new_tokens=3)).result(timeout=60).token_ids == solo(q, 3, CHUNK)
        assert w["skipped_blocks"] == 0 and c.router.counts["prefix"] == 0  # cold on both sides
        assert c.prefill.stats["hit_tokens"] == 0
