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
from engine.kernels.kvtype import kv_dots4, kv_dots8, kv_put, kv_pv

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
    """kv_put stores encode()'s bits (the 32-wide body and the tail alike); the grouped dots over the stored
    row give exactly their bits over the decoded float32 row (same order, exact widening)."""
    st = kvtype.storage(kind)
    x = _values(n)[:n] if n > 20 else (RNG.standard_normal(n) * 100).astype(np.float32)
    x[0] = 70000.0  # saturates in f16
    stored = np.zeros(n, st)
    _put(stored, stored, x)
    assert np.array_equal(stored, kvtype.encode(x, st))
    wide = np.ascontiguousarray(kvtype.decode(stored))
    q = RNG.standard_normal((8, n)).astype(np.float32)
    for slots in (8, 4):
        half, full = np.zeros((slots, 1), np.float32), np.zeros((slots, 1), np.float32)
        _dots(stored, q, stored, slots, half, slots)
        _dots(wide, q, wide, slots, full, slots)
        assert np.array_equal(half, full)


@njit(cache=False)
def _dots(like, q, k, count, out, slots):  # type: ignore[no-untyped-def]
    qa, ka, oa = np.uint64(q.ctypes.data), np.uint64(k.ctypes.data), np.uint64(out.ctypes.data)
    if slots == 8:
        kv_dots8(like, qa, ka, k.shape[0], count, oa, out.strides[0] // 4)
    else:
        kv_dots4(like, qa, ka, k.shape[0], count, oa, out.strides[0] // 4)


@njit(cache=False)
def _pv(like, p, rows, out):  # type: ignore[no-untyped-def]
    kv_pv(like, np.uint64(p.ctypes.data), np.uint64(rows.ctypes.data), p.shape[0], out.shape[0],
          np.uint64(out.ctypes.data))


@pytest.mark.parametrize("kind", kvtype.KV_DTYPES)
@pytest.mark.parametrize("dim", [64, 40, 256, 16, 7])
def test_grouped_dots_and_pv(kind: str, dim: int) -> None:
    """kv_dots8 / kv_dots4: every head's q.k against float64 (each count of heads, the slots past it left
    alone); kv_pv: exactly blockdot.axpy_f32 applied to the decoded rows one after another from zero (the
    same fma chain per value)."""
    st = kvtype.storage(kind)
    k = kvtype.encode(RNG.standard_normal(dim), st)
    kw = kvtype.decode(k).astype(np.float64)
    q = RNG.standard_normal((8, dim)).astype(np.float32)
    for slots in (8, 4):
        for count in range(1, slots + 1):
            out = np.full((slots, 3), 7.0, np.float32)  # a stride of 3 floats; column 0 written
            _dots(k, q, k, count, out, slots)
            want = q[:count].astype(np.float64) @ kw
            np.testing.assert_allclose(out[:count, 0], want, rtol=1e-5, atol=1e-5 * np.sqrt(dim))
            assert (out[count:, 0] == 7.0).all() and (out[:, 1:] == 7.0).all()
    n = 37
    vs = kvtype.encode(RNG.standard_normal((n, dim)), st)
    p = RNG.random(n).astype(np.float32)
    rows = np.array([vs[j].ctypes.data for j in range(n)], np.uint64)
    got = np.full(dim, 5.0, np.float32)
    _pv(vs, p, rows, got)
    want = np.zeros(dim, np.float32)
    for j in range(n):
        _axpy32(p[j], np.ascontiguousarray(kvtype.decode(vs[j])), want)
    assert np.array_equal(got, want)
