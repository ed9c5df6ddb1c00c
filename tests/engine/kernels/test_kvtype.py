"""KV cache element types (engine/kernels/kvtype.py): the numpy encode/decode against slow per-value references,
and the kernels' loads and stores against them, tails included."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from numba import njit

from engine.errors import EngineError
from engine.kernels import kvtype
from engine.kernels.blockdot import axpy_f32
from engine.kernels.kvtype import kv_key_tiles, kv_put, kv_pvs4, kv_pvs8, tile_scores

RNG = np.random.default_rng(5)


def _f16_ref(x: float) -> int:
    """IEEE half bits of x: struct's 'e' rounds to nearest even; past the largest half, the largest half."""
    if math.isnan(x):
        return 0x7E00
    x = max(-65504.0, min(65504.0, x))
    return struct.unpack("<H", struct.pack("<e", x))[0]


def _bf16_ref(x: float) -> int:
    """bfloat16 bits of the float32 x, rounded to nearest even, written out the slow way."""
    if math.isnan(x):
        return 0x7FC0
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    hi, lo = bits >> 16, bits & 0xFFFF
    if lo > 0x8000 or (lo == 0x8000 and hi & 1):
        hi += 1
    return hi & 0xFFFF


def _values(n: int) -> np.ndarray:
    x = np.concatenate([RNG.standard_normal(n) * 10.0 ** RNG.integers(-6, 5, n),
                        [0.0, -0.0, 1.0, 1.00390625, 1.01171875, 65504.0, 65519.0, 70000.0, -1e9, 6e-8, 1e-40]])
    return x.astype(np.float32)


@pytest.mark.parametrize("kind,ref", [("f16", _f16_ref), ("bf16", _bf16_ref)])
def test_encode_matches_the_per_value_reference(kind: str, ref) -> None:  # type: ignore[no-untyped-def]
    x = _values(3000)
    got = kvtype.encode(x, kvtype.storage(kind)).view(np.uint16)
    want = np.array([ref(float(v)) for v in x], dtype=np.uint16)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, [(float(x[i]), hex(got[i]), hex(want[i])) for i in bad[:5]]
    nan = kvtype.encode(np.array([np.nan], np.float32), kvtype.storage(kind))
    assert np.isnan(kvtype.decode(nan)[0])


@pytest.mark.parametrize("kind,rel,tiny", [("f16", 2.0**-11, 2.0**-25), ("bf16", 2.0**-8, 0.0)])
def test_decode_of_encode_is_within_half_an_ulp(kind: str, rel: float, tiny: float) -> None:
    """Half an ulp of the value; f16's subnormals (below 2**-14) within half the smallest step, 2**-25."""
    x = (RNG.standard_normal(5000) * 10.0 ** RNG.integers(-3, 4, 5000)).astype(np.float32)
    back = kvtype.decode(kvtype.encode(x, kvtype.storage(kind)))
    assert back.dtype == np.float32
    assert np.all(np.abs(back - x) <= np.maximum(rel * np.abs(x) * (1 + 1e-6), tiny))
    assert kvtype.decode(kvtype.encode(np.array([1e6], np.float32), kvtype.storage("f16")))[0] == 65504.0  # saturated
    f32 = kvtype.encode(x, kvtype.storage("f32"))
    assert f32 is x or np.array_equal(f32, x)


def test_names_and_an_unknown_dtype() -> None:
    assert [kvtype.name_of(kvtype.storage(n)) for n in kvtype.KV_DTYPES] == list(kvtype.KV_DTYPES)
    with pytest.raises(EngineError, match="unknown KV dtype 'f8'"):
        kvtype.storage("f8")


@njit(cache=False)
def _put(like, dst, src):  # type: ignore[no-untyped-def]
    kv_put(like, np.uint64(dst.ctypes.data), np.uint64(src.ctypes.data), src.shape[0])


@njit(cache=False)
def _axpy32(s, x, y):  # type: ignore[no-untyped-def]
    axpy_f32(np.float32(s), np.uint64(x.ctypes.data), np.uint64(y.ctypes.data), y.shape[0])


@pytest.mark.parametrize("kind", kvtype.KV_DTYPES)
@pytest.mark.parametrize("n", [64, 100, 7, 256])
def test_kernel_loads_and_stores(kind: str, n: int) -> None:
    """kv_put stores encode()'s bits (the 32-wide body and the tail alike); the scores against the stored row
    are exactly the scores against the decoded float32 row (same order, exact widening)."""
    st = kvtype.storage(kind)
    x = _values(n)[:n] if n > 20 else (RNG.standard_normal(n) * 100).astype(np.float32)
    x[0] = 70000.0  # saturates in f16
    stored = np.zeros(n, st)
    _put(stored, stored, x)
    assert np.array_equal(stored, kvtype.encode(x, st))
    wide = np.ascontiguousarray(kvtype.decode(stored))
    q = RNG.standard_normal((8, n)).astype(np.float32)
    got = []
    for row in (stored, wide):
        kt, sc, m = np.zeros((4, n, 16), np.float32), np.zeros((8, 64), np.float32), np.zeros(8, np.float32)
        _tiles_and_scores(row, np.array([row.ctypes.data], np.uint64), 1, n, kt, q, 8, 1.0, sc, m)
        got.append(sc[:, 0])
    assert np.array_equal(got[0], got[1])


@njit(cache=False)
def _pvs(like, p, count, rows, n, out, slots):  # type: ignore[no-untyped-def]
    pa, ra, oa = np.uint64(p.ctypes.data), np.uint64(rows.ctypes.data), np.uint64(out.ctypes.data)
    if slots == 8:
        kv_pvs8(like, pa, p.strides[0] // 4, count, ra, n, out.shape[1], oa)
    else:
        kv_pvs4(like, pa, p.strides[0] // 4, count, ra, n, out.shape[1], oa)


@pytest.mark.parametrize("kind", kvtype.KV_DTYPES)
@pytest.mark.parametrize("dim", [64, 40, 256, 16, 7, 80])
def test_many_heads_pv_is_each_heads_pv(kind: str, dim: int) -> None:
    """kv_pvs8 / kv_pvs4: for every count of heads, each head's output is exactly blockdot.axpy_f32 applied to
    the decoded rows one after another from zero (the same fma chain per value), on weight rows with a
    stride longer than n; the heads past count are not written."""
    st = kvtype.storage(kind)
    n = 45
    vs = kvtype.encode(RNG.standard_normal((n, dim)), st)
    rows = np.array([vs[j].ctypes.data for j in range(n)], np.uint64)
    p = RNG.random((8, n + 19)).astype(np.float32)  # a row stride of n + 19 floats, as the score scratch has
    want = np.zeros((8, dim), np.float32)
    for h in range(8):
        for j in range(n):
            _axpy32(p[h, j], np.ascontiguousarray(kvtype.decode(vs[j])), want[h])
    for slots in (8, 4):
        for count in range(1, slots + 1):
            got = np.full((slots, dim), 9.0, np.float32)
            _pvs(vs, p, count, rows, n, got, slots)
            for h in range(count):
                assert np.array_equal(got[h], want[h]), (slots, count, h)
            assert (got[count:] == 9.0).all()


@njit(cache=False)
def _tiles_and_scores(like, rows, n, dim, kt, q, count, scale, s, m):  # type: ignore[no-untyped-def]
    kv_key_tiles(like, np.uint64(rows.ctypes.data), n, dim, np.uint64(kt.ctypes.data))
    tile_scores(np.uint64(kt.ctypes.data), n, dim, np.uint64(q.ctypes.data), count, np.float32(scale),
                np.uint64(s.ctypes.data), s.strides[0] // 4, np.uint64(m.ctypes.data))


@pytest.mark.parametrize("kind", kvtype.KV_DTYPES)
@pytest.mark.parametrize("dim", [64, 80, 7, 256, 16])
def test_key_tiles_and_their_scores(kind: str, dim: int) -> None:
    """kv_key_tiles holds K transposed in tiles of 16 positions (kt[t, d, i] = K[16 t + i, d]); tile_scores gives
    each score as its order is written (a float32 FMA chain over d from 0, then times the scale), for every
    count of query vectors and every length around the tiles, writes no score row past its blocks of tiles, and
    gives each row's max over its n scores."""
    rng = np.random.default_rng(dim)
    st = kvtype.storage(kind)
    for n in (1, 15, 16, 17, 64, 70):
        k = kvtype.encode(rng.standard_normal((n, dim)), st)
        kw = kvtype.decode(k)
        rows = np.array([k[j].ctypes.data for j in range(n)], np.uint64)
        tiles = -(-n // 64) * 4
        kt = np.full((tiles, dim, 16), 1e3, np.float32)  # tiles past n: values no score may reach
        for count in (1, 2, 7, 8):
            q = rng.standard_normal((count, dim)).astype(np.float32)
            s = np.full((count, tiles * 16 + 3), 7.0, np.float32)
            m = np.zeros(count, np.float32)
            _tiles_and_scores(k, rows, n, dim, kt, q, count, 0.3, s, m)
            for t in range(-(-n // 16)):
                live = min(16, n - 16 * t)
                assert np.array_equal(kt[t, :, :live], kw[16 * t:16 * t + live].T)
            want = np.zeros((count, n), np.float32)
            for d in range(dim):  # a float32 product is exact in float64; the sum rounds twice (f64, f32), which
                # can differ from the FMA's one rounding only on rare ties (none with these seeds)
                want = (want + q[:, d:d + 1].astype(np.float64) * kw[None, :, d]).astype(np.float32)
            want = (want * np.float32(0.3)).astype(np.float32)
            assert np.array_equal(s[:, :n], want), (n, count)
            assert np.array_equal(m, want.max(axis=1))
            assert (s[:, tiles * 16:] == 7.0).all()
