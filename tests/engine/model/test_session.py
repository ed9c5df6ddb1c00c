"""Sessions on the synthetic checkpoint: batched == serial bit for bit, append-only prefill, KV safety."""

from __future__ import annotations

import numpy as np
import pytest

from engine import BatchSession, Session, step_batch, synthetic_model
from engine.errors import EngineError
from engine.model.kv import KVExhausted, PageTable
from support.numba_threads import ParallelLaunches


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    return synthetic_model()


PROMPTS = [list(b"a"), list(b"hello there"), list(b"the quick brown fox jumps over the lazy dog"), list(range(40, 77))]


def _greedy_serial(model, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:  # type: ignore[no-untyped-def]
    s = Session(model)
    logits = s.prefill(prompt)
    toks, all_logits = [], []
    for _ in range(n):
        t = int(np.argmax(logits))
        toks.append(t)
        logits = s.step(t)
        all_logits.append(logits)
    return toks, all_logits


def test_step_batch_bit_identical_to_serial_steps(model) -> None:  # type: ignore[no-untyped-def]
    n = 12
    serial = [_greedy_serial(model, p, n) for p in PROMPTS]
    sessions = [Session(model) for _ in PROMPTS]
    first = [int(np.argmax(s.prefill(p))) for s, p in zip(sessions, PROMPTS, strict=False)]
    batch = BatchSession(sessions)
    toks = first
    for i in range(n):
        logits = batch.step_batch(toks)
        assert logits.shape == (4, 256)
        for lane in range(4):
            assert toks[lane] == serial[lane][0][i]
            assert np.array_equal(logits[lane], serial[lane][1][i]), f"lane {lane} step {i}"
        toks = [int(np.argmax(r)) for r in logits]
    assert [s.length for s in sessions] == [len(p) + n for p in PROMPTS]


def test_a_wide_step_batch_runs_the_parallel_kernels_and_equals_serial_steps(model) -> None:  # type: ignore[no-untyped-def]
    """80 lanes: the batched weight products are big enough for the parallel kernels (on >= 2 threads),
    a lone step runs the serial twins; each lane's logits must still be the same bits."""
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(0, 256, 1 + i % 7)] for i in range(80)]
    serial = []
    for p in prompts:
        s = Session(model)
        s.prefill(p)
        serial.append(s.step(p[0]))
    sessions = [Session(model) for _ in prompts]
    for s, p in zip(sessions, prompts, strict=False):
        s.prefill(p)
    with ParallelLaunches() as launches:
        batched = step_batch(sessions, [p[0] for p in prompts])
    launches.assert_multithreaded()
    assert all(np.array_equal(batched[b], row) for b, row in enumerate(serial))


def test_step_batch_changing_set(model) -> None:  # type: ignore[no-untyped-def]
    # A scheduler batches whatever is running: lanes join and leave between steps.
    a, b, c = Session(model), Session(model), Session(model)
    ref_a, ref_c = Session(model), Session(model)
    for s in (a, ref_a):
        s.prefill(PROMPTS[1])
    for s in (c, ref_c):
        s.prefill(PROMPTS[2])
    b.prefill(PROMPTS[0])
    la = step_batch([a, b], [5, 6])[0]
    assert np.array_equal(la, ref_a.step(5))
    lc, la2 = step_batch([c, a], [7, 8])
    assert np.array_equal(lc, ref_c.step(7))
    assert np.array_equal(la2, ref_a.step(8))


def test_prefill_appends_bit_exact_with_row_stable_prefill(model) -> None:  # type: ignore[no-untyped-def]
    model.prefill_blas = False
    try:
        p = PROMPTS[2]
        one = Session(model)
        l1 = one.prefill(p)
        two = Session(model)
        two.prefill(p[:5])
        two.prefill(p[5:30])
        l2 = two.prefill(p[30:])
        assert np.array_equal(l1, l2)
        steps = Session(model)
        for t in p:
            l3 = steps.step(t)
        assert np.array_equal(l1, l3)
        assert one.tokens == two.tokens == steps.tokens == p
    finally:
        model.prefill_blas = True


def test_prefill_appends_blas(model) -> None:  # type: ignore[no-untyped-def]
    p = PROMPTS[2]
    one, two = Session(model), Session(model)
    l1 = one.prefill(p)
    two.prefill(p[:17])
    l2 = two.prefill(p[17:])
    np.testing.assert_allclose(l1, l2, atol=1e-4)
    assert int(np.argmax(l1)) == int(np.argmax(l2))
    assert two.length == len(p) and two.tokens == p


def test_fixed_pool_exhaustion_leaves_sessions_unchanged(model) -> None:  # type: ignore[no-untyped-def]
    pool = model.new_pool(num_blocks=4, block_tokens=4)
    a, b = Session(model, pool), Session(model, pool)
    a.prefill(list(range(8)))  # 2 blocks
    b.prefill(list(range(8)))  # 2 blocks
    assert pool.num_free == 0
    before = (list(a.kv.blocks), a.length, list(a.tokens), pool.k.copy())
    with pytest.raises(KVExhausted):
        a.prefill([1, 2])
    with pytest.raises(KVExhausted):
        step_batch([a, b], [1, 2])
    assert (list(a.kv.blocks), a.length, list(a.tokens)) == before[:3]
    assert np.array_equal(pool.k, before[3])
    b.free()  # preempt b: a can continue
    ref = Session(model)
    ref.prefill(list(range(8)))
    assert np.array_equal(a.step(3), ref.step(3))


def test_shared_prefix_blocks_copy_on_write(model) -> None:  # type: ignore[no-untyped-def]
    pool = model.new_pool(num_blocks=16, block_tokens=4)
    prefix = list(b"shared pre")  # 10 tokens: 2 full blocks + a partial one
    owner = Session(model, pool)
    owner.prefill(prefix)
    owner_k = pool.k[:, owner.kv.blocks].copy()
    # prefix reuse: another session starts from the owner's blocks
    reuser = Session(model, pool)
    for blk in owner.kv.blocks:
        pool.incref(blk)
    reuser.kv = PageTable(pool, list(owner.kv.blocks), owner.length)
    reuser.tokens = list(prefix)
    got = reuser.prefill(list(b"fix tail"))
    ref = Session(model)
    want = ref.prefill(prefix + list(b"fix tail"))
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert reuser.kv.blocks[:2] == owner.kv.blocks[:2]  # full blocks stay shared
    assert reuser.kv.blocks[2] != owner.kv.blocks[2]  # the partial one was copied before writing
    assert np.array_equal(pool.k[:, owner.kv.blocks], owner_k)  # the owner's KV is untouched


def test_bad_ids(model) -> None:  # type: ignore[no-untyped-def]
    s = Session(model)
    with pytest.raises(EngineError, match="out of range"):
        s.prefill([1, 300])
    with pytest.raises(EngineError, match="empty"):
        s.prefill([])
    with pytest.raises(EngineError, match="twice"):
        step_batch([s, s], [1, 2])
    assert s.length == 0


def test_synthetic_is_deterministic() -> None:
    a, b = synthetic_model(), synthetic_model()
    for wa, wb in zip(a.weights.layers, b.weights.layers, strict=False):
        assert np.array_equal(wa.wq, wb.wq)
    la = Session(a).prefill(PROMPTS[1])
    lb = Session(b).prefill(PROMPTS[1])
    assert np.array_equal(la, lb)


def test_warmup_loads_every_kernel() -> None:
    import subprocess
    import sys

    code = ("from engine.model.session import warmup; warmup(); "
            "from engine.model import linear; from engine.kernels import ops, attention as a; "
            "from engine.kernels.parallel import serial_twin; "
            "ks = (linear._rows_kernel, ops._rmsnorm, ops._gated, ops._residual_norm, ops._qkv_prep, a._paged_attention); "
            "from engine.kernels.lane_kernel import lane_layers; "
            "print(all(len(k.signatures) > 0 and len(serial_twin(k).signatures) > 0 for k in ks) "
            "and len(lane_layers.signatures) > 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr


@pytest.mark.slow
@pytest.mark.gemma
def test_a_packaged_model_warms_only_its_tile_kind_group() -> None:
    """The first run of a Q4_K_M file compiles the tile kernels' first kind group only (Q8_0, Q5_0, Q4_K,
    Q6_K: 4 of the 10 kinds' bodies), and its requests then compile nothing."""
    import subprocess
    import sys

    code = ("from engine.model.loader import load_model; "
            "m = load_model('gemma3-270m', resident=True, progress=False); "
            "from engine.model.session import Session, warmup; warmup(); "
            "from engine.kernels import tilegemm as T; from engine.kernels.parallel import serial_twin; "
            "ks = [k for kind in (0, 4, 8) for g in (T.gemm_for(kind), T.dq_rows_for(kind)) for k in (g, serial_twin(g))]; "
            "ks += [T.gemm_tiles, T.dq_rows_tiles]; "
            "before = [len(k.signatures) for k in ks]; "
            "s = Session(m); s.prefill([2, 651, 6037]); s.step(529); "
            "print([min(n, 1) for n in before], before == [len(k.signatures) for k in ks])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    # compiled: group 0's product, its twin and dequantizer (its twin is never launched); not the others
    assert out.stdout.strip() == "[1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0] True", out.stderr[-2000:]
