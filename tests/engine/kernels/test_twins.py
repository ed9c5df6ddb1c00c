"""Small work runs a kernel's serial twin, big work the parallel kernel (engine/kernels/parallel.py), and which
one runs depends on the batch size: so for step_batch to stay bit-identical to serial steps, a
twin must give exactly the parallel kernel's bits, row for row. Checked here for every kernel that
goes through `launch`, at several widths (with reassociating fast-math sums, rmsnorm and attention
did differ: their sums are now written in a fixed order). The parallel kernel runs on the
default team (checked: >= 2 threads, else the comparison says nothing about threads) and on one thread:
the bits must not depend on the thread count either."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from engine.kernels import kvtype, ops
from engine.kernels import tilegemm as T
from engine.kernels.attention import RaggedRows, _paged_attention, batched_attention, chunk_positions
from engine.kernels.parallel import serial_twin
from engine.model.linear import _rows_kernel
from engine.quant import rows as K
from engine.quant import tiles as L
from support.blocks import TYPES, random_blocks
from support.numba_threads import team_size

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def _several_threads() -> None:
    assert numba.get_num_threads() >= 2 and team_size() >= 2, (
        f"numba runs {numba.get_num_threads()} thread(s) here: the parallel kernels would not split their loops")


def _arrays(args: tuple) -> list[np.ndarray]:  # type: ignore[type-arg]
    return [x for x in args if isinstance(x, np.ndarray)]


def _both(kernel, make_args) -> tuple[list[np.ndarray], list[np.ndarray]]:  # type: ignore[no-untyped-def]
    """Run kernel (on the default team of threads) and its twin on identical fresh arguments."""
    a, b = make_args(), make_args()
    kernel(*a)
    serial_twin(kernel)(*b)
    return _arrays(a), _arrays(b)


def _assert_same(kernel, make_args) -> None:  # type: ignore[no-untyped-def]
    got, want = _both(kernel, make_args)
    one = make_args()
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        kernel(*one)
    finally:
        numba.set_num_threads(threads)
    for g, w, o in zip(got, want, _arrays(one), strict=False):
        assert np.array_equal(g, w, equal_nan=True)  # parallel kernel == serial twin
        assert np.array_equal(g, o, equal_nan=True)  # on a team of threads == on one thread


@pytest.mark.parametrize("rows,width", [(1, 640), (17, 640), (3, 1024), (5, 2048), (2, 256), (9, 100)])
def test_rmsnorm_twin(rows: int, width: int) -> None:
    x = RNG.standard_normal((rows, width)).astype(np.float32) * 5
    w = RNG.standard_normal(width).astype(np.float32)
    _assert_same(ops._rmsnorm, lambda: (x.copy(), w, 1e-6, np.zeros_like(x)))


@pytest.mark.parametrize("gelu", [True, False])
@pytest.mark.parametrize("rows,width", [(1, 2048), (19, 2048), (4, 4864), (3, 130)])
def test_gated_twin(gelu: bool, rows: int, width: int) -> None:
    g = RNG.standard_normal((rows, width)).astype(np.float32) * 4
    u = RNG.standard_normal((rows, width)).astype(np.float32)
    _assert_same(ops._gated, lambda: (g, 0, u, 0, gelu, np.zeros_like(g)))
    gu = np.concatenate([u, g], axis=1)  # the fused product's layout (here up first): columns read in place
    _assert_same(ops._gated, lambda: (gu, width, gu, 0, gelu, np.zeros_like(g)))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.slow
def test_dequantize_rows_twin(qtype: QT) -> None:
    """The embedding take (decode) runs the twin for few rows, the parallel kernel for many."""
    cols = 640 if qtype in (QT.Q8_0, QT.Q5_0) else 2048
    raw = random_blocks(qtype, 40, cols, seed=int(qtype))
    rows = np.array([39, 0, 7, 7, 21], dtype=np.int64)
    kernel = K.DQ_ROWS[qtype.name]
    _assert_same(kernel, lambda: (raw, rows, np.zeros((5, cols), np.float32), K.F16_LUT, K.QK))


@pytest.mark.slow
def test_q5_0_repack_twin() -> None:
    raw = random_blocks(QT.Q5_0, 33, 320, seed=8)
    _assert_same(K.repack_q5_0_q8_0, lambda: (raw, np.zeros((33, 320 // 32 * 34), np.uint8)))


@pytest.mark.parametrize("kind,qtype,n", [(0, QT.Q8_0, 640), (1, QT.Q5_0, 640), (2, QT.Q4_K, 512), (3, QT.Q6_K, 768),
                                          (4, QT.Q4_0, 640), (5, QT.Q4_1, 640), (6, QT.Q5_1, 640), (7, QT.Q5_K, 512),
                                          (8, QT.F16, 640), (9, QT.BF16, 640)])
@pytest.mark.parametrize("lanes", [1, 5, 16])
@pytest.mark.slow
def test_tile_kernels_twins(kind: int, qtype: QT, n: int, lanes: int) -> None:
    """The 16-row tiles' product (engine/kernels/tilegemm.py; int16 dots, F16 / BF16 float FMAs); repack and
    dequantize are serial."""
    raw = random_blocks(qtype, 37, n, seed=9 + kind)
    shape = L.tiled_shape(kind, 37, n)
    tiles = np.zeros(shape, np.uint8)
    L.repack_tiles(kind, raw, tiles)
    x = RNG.standard_normal((lanes, n)).astype(np.float32)
    _assert_same(T.gemm_for(kind), lambda: (kind, tiles, x, np.zeros((lanes, 37), np.float32)))
    x = RNG.standard_normal((70, n)).astype(np.float32)  # past one lane block
    _assert_same(T.gemm_for(kind), lambda: (kind, tiles, x, np.zeros((70, 37), np.float32)))


def test_rope_twin() -> None:
    x = RNG.standard_normal((23, 4, 256)).astype(np.float32)
    cos, sin = ops.rope_tables(np.arange(50, 73), 10000.0, 256)
    _assert_same(ops._rope, lambda: (x, cos, sin, True, np.zeros_like(x)))


@pytest.mark.parametrize("window,softcap,dim,blocks,kv", [(0, 0.0, 256, 6, "f32"), (24, 0.0, 256, 6, "f32"),
                                                           (0, 50.0, 256, 6, "f32"), (0, 0.0, 40, 6, "f32"),
                                                           (0, 0.0, 256, 30, "f32"), (200, 0.0, 64, 30, "f32"),
                                                           (0, 0.0, 40, 6, "f16"), (24, 50.0, 64, 30, "f16"),
                                                           (0, 0.0, 40, 6, "bf16"), (24, 0.0, 256, 30, "bf16")])
def test_paged_attention_twin(window: int, softcap: float, dim: int, blocks: int, kv: str) -> None:
    """f16 / bf16 pools (engine/kernels/kvtype.py) too: the same bits as a float32 pool holding the values
    they decode to (widening is exact and the sums run in the same order)."""
    bt, kvh, heads = 16, 1, 4  # 30 blocks: up to 480 positions, several key chunks per row
    st = kvtype.storage(kv)
    k = kvtype.encode(RNG.standard_normal((40, bt, kvh, dim)), st)
    v = kvtype.encode(RNG.standard_normal((40, bt, kvh, dim)), st)
    top = 16 * blocks - 26
    rows = RaggedRows.of([list(RNG.permutation(40)[:blocks]), list(RNG.permutation(40)[:blocks - 1])], [top, 40], [3, 1], bt)
    q = RNG.standard_normal((4, heads, dim)).astype(np.float32)
    none, no_ids = np.empty((0, kvh, dim), np.float32), np.empty(0, np.int64)
    for chunk in (chunk_positions(dim), 7):
        _assert_same(_paged_attention, lambda chunk=chunk: (q, k, v, rows.tables, rows.row_lane, rows.row_pos, window, 0.0625,
                                                softcap, chunk, none, none, no_ids, no_ids, np.zeros_like(q)))
    out = batched_attention(q, k, v, rows, window, 0.0625, softcap)
    one = batched_attention(q[3:4], k, v, RaggedRows(rows.tables, rows.row_lane[3:4], rows.row_pos[3:4]), window,
                            0.0625, softcap)
    assert np.array_equal(one[0], out[3])  # a lone row gets the bits it gets in the batch
    if kv != "f32":
        wide = batched_attention(q, kvtype.decode(k), kvtype.decode(v), rows, window, 0.0625, softcap)
        assert np.array_equal(out, wide)
    # the rows' own K/V stored by the kernel == stored by numpy first, and the twin agrees with the team
    kn, vn = RNG.standard_normal((2, 4, kvh, dim)).astype(np.float32)
    blk = rows.tables[rows.row_lane, rows.row_pos // bt]
    off = rows.row_pos % bt
    k2, v2 = k.copy(), v.copy()
    k2[blk, off], v2[blk, off] = kvtype.encode(kn, st), kvtype.encode(vn, st)  # rounded as the kernel stores
    want = batched_attention(q, k2, v2, rows, window, 0.0625, softcap)
    k3, v3 = k.copy(), v.copy()
    got = batched_attention(q, k3, v3, rows, window, 0.0625, softcap, (kn, vn, blk, off))
    assert np.array_equal(got, want) and np.array_equal(k3, k2) and np.array_equal(v3, v2)
    _assert_same(_paged_attention, lambda: (q, k.copy(), v.copy(), rows.tables, rows.row_lane, rows.row_pos, window,
                                            0.0625, softcap, 16, kn, vn, blk, off, np.zeros_like(q)))


@pytest.mark.parametrize("width", [640, 100, 130, 2048, 48])
def test_plain_rows_kernel_twin(width: int) -> None:
    x = RNG.standard_normal((5, width)).astype(np.float32)
    w = RNG.standard_normal((300, width)).astype(np.float32)
    _assert_same(_rows_kernel, lambda: (x, w, np.zeros((5, 300), np.float32)))
