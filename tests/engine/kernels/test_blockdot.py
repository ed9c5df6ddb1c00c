"""engine/kernels/blockdot.py: the LLVM-IR block dots behind every resident decode product.

test_kernels.py checks QuantWeight.matmul against the float64 reference; here: the lane groups
(8, 4, 1) give every lane the same bits, the serial twin equals the parallel kernel, misaligned or
strided activations change nothing, and bad shapes are refused before any raw address is read.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize
from numba import njit

from engine.kernels.blockdot import gemm, max_f32, sum_f32
from engine.kernels.parallel import serial_twin
from engine.quant import rows as K
from support.blocks import TYPES, random_blocks

COLS = {QT.Q8_0: 640, QT.Q5_0: 640, QT.Q4_K: 1024, QT.Q6_K: 1024}


def _case(qtype: QT, rows: int = 300, lanes: int = 13, seed: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
    raw = random_blocks(qtype, rows, COLS[qtype], seed=seed)
    x = np.random.default_rng(seed + 1).standard_normal((lanes, COLS[qtype])).astype(np.float32)
    return raw, x, K.KIND[qtype.name]


def _gemm(raw: np.ndarray, x: np.ndarray, kind: int, fn=gemm) -> np.ndarray:  # type: ignore[no-untyped-def]
    out = np.empty((x.shape[0], raw.shape[0]), np.float32)
    fn(raw, x, out, K.F16_LUT, kind)
    return out


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.slow
def test_every_lane_group_gives_the_same_bits(qtype: QT) -> None:
    """13 lanes run as 8 + 4 + 1: each row equals the same row computed alone, and all are close to
    the float64 reference (300 rows: every parallel chunk boundary is crossed)."""
    raw, x, kind = _case(qtype)
    full = _gemm(raw, x, kind)
    for b in range(x.shape[0]):
        assert np.array_equal(_gemm(raw, x[b:b + 1], kind)[0], full[b]), f"lane {b}"
    assert np.array_equal(_gemm(raw, x[4:12], kind), full[4:12])  # one group of 8
    assert np.array_equal(_gemm(raw, x[1:6], kind), full[1:6])  # 4 + 1
    w = dequantize(raw, qtype).astype(np.float64)
    ref = x.astype(np.float64) @ w.T
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T
    assert np.all(np.abs(full - ref) <= 2e-6 * scale + 1e-6)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.slow
def test_serial_twin_equals_parallel_kernel(qtype: QT) -> None:
    raw, x, kind = _case(qtype, rows=150, lanes=9, seed=3)
    assert np.array_equal(_gemm(raw, x, kind, serial_twin(gemm)), _gemm(raw, x, kind))


@pytest.mark.slow
def test_misaligned_and_strided_activations() -> None:
    raw, x, kind = _case(QT.Q8_0, rows=70, lanes=5, seed=5)
    want = _gemm(raw, x, kind)
    buf = np.zeros(x.size + 1, np.float32)
    shifted = buf[1:].reshape(x.shape)  # 4 bytes past a 64-byte boundary at best
    shifted[:] = x
    assert np.array_equal(_gemm(raw, shifted, kind), want)
    wide = np.zeros((x.shape[0], x.shape[1] + 32), np.float32)
    wide[:, :x.shape[1]] = x
    assert np.array_equal(_gemm(raw, wide[:, :x.shape[1]], kind), want)  # rows 32 floats apart


@pytest.mark.slow
def test_bad_shapes_are_refused_not_read() -> None:
    raw, x, kind = _case(QT.Q8_0, rows=8, lanes=2, seed=9)
    out = np.empty((2, 8), np.float32)
    bad = [
        (raw[:, :-34], x, out, kind),  # rows one block short
        (raw, x[:, :-32], out, kind),  # activation one block short
        (raw, x, np.empty((2, 7), np.float32), kind),  # output too narrow
        (raw, x, np.empty((3, 8), np.float32), kind),  # output lanes differ
        (raw, x, out, 7),  # no such kind
        (raw, x, out, K.KIND["Q4_K"]),  # 640 values are not whole 256-value super-blocks
        (np.repeat(raw, 2, axis=1)[:, ::2], x, out, kind),  # weight bytes not contiguous
    ]
    for args in bad:
        with pytest.raises(ValueError, match="shapes do not match"):
            gemm(args[0], args[1], args[2], K.F16_LUT, args[3])


@njit(cache=False)
def _max_at(x, first, n):  # type: ignore[no-untyped-def]
    return max_f32(np.uint64(x.ctypes.data + 4 * first), n)


def test_max_f32_is_numpy_max() -> None:
    """max_f32 over every length around the 32-lane body (misaligned starts too), -inf for none."""
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(300) * 50).astype(np.float32)
    x[[7, 77, 250]] = [-np.inf, 1e30, -1e30]
    for first in (0, 1, 3):
        for n in (0, 1, 2, 31, 32, 33, 64, 95, 257):
            want = x[first : first + n].max() if n else -np.inf
            assert _max_at(x, first, n) == want
    assert _max_at(np.full(40, -np.inf, np.float32), 0, 40) == -np.inf


@njit(cache=False)
def _sum_at(x, first, n):  # type: ignore[no-untyped-def]
    return sum_f32(np.uint64(x.ctypes.data + 4 * first), n)


def _sum_ref(x: np.ndarray) -> np.float32:
    """sum_f32's order written out: lane i adds values i, i + 32, ... in sequence (float32), the 32 lanes fold
    by halves (lane i + lane i + h), then the tail adds in sequence."""
    body = len(x) // 32 * 32
    lanes = np.zeros(32, np.float32)
    for c in range(0, body, 32):
        lanes = (lanes + x[c : c + 32]).astype(np.float32)
    while len(lanes) > 1:
        h = len(lanes) // 2
        lanes = (lanes[:h] + lanes[h:]).astype(np.float32)
    tot = lanes[0]
    for v in x[body:]:
        tot = np.float32(tot + v)
    return tot


def test_sum_f32_adds_in_its_written_order() -> None:
    """sum_f32 gives the bits of its order written out in numpy, for every length around the 32-lane body
    (misaligned starts too), and is close to the float64 sum; 0 for none."""
    rng = np.random.default_rng(6)
    x = (rng.random(400) * np.exp(rng.standard_normal(400) * 4)).astype(np.float32)  # magnitudes 1e-5..1e5
    for first in (0, 1, 3):
        for n in (0, 1, 2, 31, 32, 33, 64, 95, 257, 390):
            part = x[first : first + n]
            got = _sum_at(x, first, n)
            assert got == _sum_ref(part), (first, n)
            np.testing.assert_allclose(got, part.astype(np.float64).sum(), rtol=1e-5)
