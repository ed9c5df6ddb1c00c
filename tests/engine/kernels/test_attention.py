"""Decode attention (engine/kernels/attention.py): each row's result is the reference's within float32 error,
the same bits whatever rows share its call, and attend_chunk writes no further than the scratch it documents."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from engine.kernels import kvtype
from engine.kernels.attention import (
    RaggedRows,
    attend_chunk,
    batched_attention,
    chunk_positions,
    key_tiles,
    reference_attention,
    score_columns,
)
from engine.kernels.kvtype import TILE_KEYS

U = np.uint64
GUARD = 512


@njit(cache=False)
def _chunk(kp, vp, q, table, kh, lo, n, scale, softcap, s, rows, kt, pm, pl, po):  # type: ignore[no-untyped-def]
    ka, va = U(kp.ctypes.data), U(vp.ctypes.data)
    attend_chunk(kp, vp, U(q.ctypes.data), ka, va, U(kp.strides[0]), U(kp.strides[1]), U(kp.strides[2]),
                 U(vp.strides[0]), U(vp.strides[1]), U(vp.strides[2]), table, kp.shape[1], kh, lo, n, scale, softcap,
                 s, rows, kt, pm, pl, po)


def _guarded(shape: tuple[int, ...], dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """An array of `shape` at the front of a larger one whose tail holds a known pattern."""
    size = int(np.prod(shape))
    whole = np.full(size + GUARD, 3, dtype=dtype)
    return whole, whole[:size].reshape(shape)


@pytest.mark.parametrize("dim,heads,kvh", [(16, 4, 2), (64, 14, 2), (32, 8, 1), (80, 10, 5), (256, 4, 1), (8, 9, 1)])
@pytest.mark.parametrize("kind", ["f16", "f32"])
def test_a_chunk_writes_only_its_scratch(dim: int, heads: int, kvh: int, kind: str) -> None:
    """attend_chunk over every length of chunk, from block-aligned and unaligned starts, with the scratch
    sized exactly as documented (scores: score_columns, key tiles: key_tiles): nothing past any of them
    changes, and each head's partial softmax is the float64 one's."""
    rng = np.random.default_rng(dim + heads)
    group, bt, nb = heads // kvh, 16, 48
    st = kvtype.storage(kind)
    kp = kvtype.encode(rng.standard_normal((nb, bt, kvh, dim)), st)
    vp = kvtype.encode(rng.standard_normal((nb, bt, kvh, dim)), st)
    table = rng.permutation(nb).astype(np.int64)
    chunk = chunk_positions(dim)
    s_all, s = _guarded((group, score_columns(chunk)), np.float32)
    kt_all, kt = _guarded((key_tiles(chunk), dim, TILE_KEYS), np.float32)
    rows_all, rows = _guarded((2, chunk), np.uint64)
    out_all, po = _guarded((group, dim), np.float32)
    pm_all, pm = _guarded((group,), np.float32)
    pl_all, pl = _guarded((group,), np.float32)
    q = rng.standard_normal((heads, dim)).astype(np.float32)
    kd, vd = kvtype.decode(kp)[table].reshape(-1, kvh, dim), kvtype.decode(vp)[table].reshape(-1, kvh, dim)
    for lo in (0, 5, 17):
        for n in sorted({n for n in (1, 15, 16, 17, 43, chunk) if n <= chunk}):  # a chunk holds at most `chunk`
            for kh in range(kvh):
                _chunk(kp, vp, q, table, kh, lo, n, 0.3, 0.0, s, rows, kt, pm, pl, po)
                for arr in (s_all, kt_all, rows_all, out_all, pm_all, pl_all):
                    assert (arr[-GUARD:] == 3).all(), (lo, n, kh)
                k = kd[lo:lo + n, kh].astype(np.float64)
                sc = q[kh * group:(kh + 1) * group].astype(np.float64) @ k.T * 0.3
                m = sc.max(axis=1)
                np.testing.assert_allclose(pm, m, rtol=1e-5, atol=1e-5)
                p = np.exp(sc - pm[:, None].astype(np.float64))
                np.testing.assert_allclose(pl, p.sum(axis=1), rtol=1e-4)
                np.testing.assert_allclose(po, p @ vd[lo:lo + n, kh].astype(np.float64), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window,softcap", [(0, 0.0), (40, 0.0), (0, 30.0)])
def test_a_row_gets_the_same_bits_beside_any_rows(window: int, softcap: float) -> None:
    """Rows of four lanes (one row, a verification's six, a chunk of 20, eight rows across a key-chunk boundary:
    the run's first rows have one chunk fewer than its last) in one call: every row's output is bit for bit the
    row computed alone, and close to the float64 reference."""
    rng = np.random.default_rng(3)
    heads, kvh, dim, bt = 14, 2, 64, 16
    nb = 80
    kp = kvtype.encode(rng.standard_normal((nb, bt, kvh, dim)), kvtype.storage("f16"))
    vp = kvtype.encode(rng.standard_normal((nb, bt, kvh, dim)), kvtype.storage("f16"))
    lanes = [(list(range(0, 20)), 300, 1), (list(range(20, 40)), 250, 6), (list(range(40, 60)), 97, 20),
             (list(range(60, 80)), chunk_positions(dim) - 4, 8)]
    rows = RaggedRows.of([b for b, _, _ in lanes], [s for _, s, _ in lanes], [c for _, _, c in lanes], bt)
    q = rng.standard_normal((sum(c for _, _, c in lanes), heads, dim)).astype(np.float32)
    together = batched_attention(q, kp, vp, rows, window, 0.125, softcap)
    r = 0
    for blocks, start, count in lanes:
        for i in range(count):
            alone = batched_attention(q[r:r + 1], kp, vp, RaggedRows.of([blocks], [start + i], [1], bt), window, 0.125,
                                      softcap)
            assert np.array_equal(alone[0], together[r]), (start, i)
            r += 1
        k = kvtype.decode(kp)[blocks].reshape(-1, kvh, dim)
        v = kvtype.decode(vp)[blocks].reshape(-1, kvh, dim)
        r0 = r - count
        want = reference_attention(q[r0:r], k, v, start, window, 0.125, softcap)
        np.testing.assert_allclose(together[r0:r], want, rtol=2e-4, atol=2e-4)
