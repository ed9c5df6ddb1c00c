"""Q8_0 / Q4_K / Q5_K / Q6_K quantizers: bit-exact with gguf's Q8_0, Q4_K vs a scalar transliteration of the
reference, Q5_K and the Q6_K fixture quantizer by their round trip through gguf-py's dequantizer."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

from engine.quant.quantize import quantize_q4_k, quantize_q5_k, quantize_q6_k, quantize_q8_0

f32 = np.float32


@pytest.mark.parametrize("shape", [(1, 32), (7, 96), (33, 640)])
def test_q8_0_is_bit_exact_with_gguf(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(shape[0])
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block: d = 0
    if shape[1] >= 64:
        x[-1, 32:64] = 0.5  # halves at the rounding edge
    assert np.array_equal(quantize_q8_0(x), quantize(x, QT.Q8_0))


def _nearest(v: float) -> int:
    return int(np.rint(f32(v)))


def _qkx2_scalar(x: np.ndarray, w: np.ndarray) -> tuple[list[int], float, float]:
    """One 32-value sub-block, loop by loop, float32, sequential sums (the C reference's shape)."""
    nmax, rmin, rdelta, nstep = 15, f32(-1.0), f32(0.1), 20
    mn, mx = f32(x[0]), f32(x[0])
    sum_w, sum_x = f32(w[0]), f32(w[0] * x[0])
    for i in range(1, 32):
        mn, mx = min(mn, x[i]), max(mx, x[i])
        sum_w = f32(sum_w + w[i])
        sum_x = f32(sum_x + w[i] * x[i])
    mn = min(mn, f32(0))
    if mx == mn:
        return [0] * 32, 0.0, float(-mn)
    iscale = f32(nmax / f32(mx - mn))
    scale = f32(1 / iscale)
    L = [max(0, min(nmax, _nearest(iscale * (x[i] - mn)))) for i in range(32)]
    best = f32(0)
    for i in range(32):
        d = f32(scale * L[i] + mn - x[i])
        best = f32(best + w[i] * d * d)
    for k in range(nstep + 1):
        isc = f32((rmin + rdelta * k + nmax) / f32(mx - mn))
        la = [max(0, min(nmax, _nearest(isc * (x[i] - mn)))) for i in range(32)]
        sl = sl2 = sxl = f32(0)
        for i in range(32):
            sl = f32(sl + w[i] * la[i])
            sl2 = f32(sl2 + w[i] * la[i] * la[i])
            sxl = f32(sxl + w[i] * la[i] * x[i])
        D = f32(sum_w * sl2 - sl * sl)
        if D > 0:
            ts = f32((sum_w * sxl - sum_x * sl) / D)
            tm = f32((sl2 * sum_x - sl * sxl) / D)
            if tm > 0:
                tm, ts = f32(0), f32(sxl / sl2)
            cur = f32(0)
            for i in range(32):
                d = f32(ts * la[i] + tm - x[i])
                cur = f32(cur + w[i] * d * d)
            if cur < best:
                L, best, scale, mn = la, cur, ts, tm
    return L, float(scale), float(-mn)


def _q4_k_block_scalar(x: np.ndarray) -> bytes:
    scales, mins, L = [], [], []
    for j in range(8):
        s = x[32 * j : 32 * j + 32]
        av = f32(np.sqrt(f32(np.sum(s * s, dtype=f32)) / f32(32)))
        lj, sc, m = _qkx2_scalar(s, (av + np.abs(s)).astype(f32))
        scales.append(f32(sc))
        mins.append(f32(m))
        L.append(lj)
    ms, mm = max(scales), max(mins)
    inv_s = f32(63) / ms if ms > 0 else f32(0)
    inv_m = f32(63) / mm if mm > 0 else f32(0)
    ls = [min(63, _nearest(inv_s * s) & 0xFF) for s in scales]
    lm = [min(63, _nearest(inv_m * m) & 0xFF) for m in mins]
    packed = [0] * 12
    for j in range(8):
        if j < 4:
            packed[j] = ls[j]
            packed[j + 4] = lm[j]
        else:
            packed[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4)
            packed[j - 4] |= (ls[j] >> 4) << 6
            packed[j] |= (lm[j] >> 4) << 6
    d16, dm16 = np.float16(ms / f32(63)), np.float16(mm / f32(63))
    for j in range(8):
        d = f32(d16) * ls[j]
        if d == 0:
            continue
        dm = f32(dm16) * lm[j]
        L[j] = [max(0, min(15, _nearest(f32(x[32 * j + i] + dm) / d))) for i in range(32)]
    qs = [L[2 * c][i] | (L[2 * c + 1][i] << 4) for c in range(4) for i in range(32)]
    return d16.tobytes() + dm16.tobytes() + bytes(packed) + bytes(qs)


def test_q4_k_matches_scalar_reference() -> None:
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 1024)) * rng.uniform(0.01, 3, (3, 1))).astype(np.float32)
    x[1, 256:288] = 0.25  # a constant sub-block
    x[2, :256] = np.abs(x[2, :256])  # all-positive super-block: min clamps to 0
    got = quantize_q4_k(x).reshape(-1, 144)
    want = [_q4_k_block_scalar(b) for b in x.reshape(-1, 256)]
    same = [bytes(g.tobytes()) == w for g, w in zip(got, want, strict=False)]
    assert sum(same) >= len(same) - 1  # pairwise vs sequential float32 sums may flip one rounding
    ref = dequantize(np.frombuffer(b"".join(want), np.uint8).reshape(-1, 144), QT.Q4_K)
    step = np.abs(x).max() / 15
    assert np.abs(dequantize(got, QT.Q4_K) - ref).max() <= step


def test_q4_k_roundtrip_error_and_idempotence() -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal((16, 512)).astype(np.float32)
    q = quantize_q4_k(x)
    assert q.shape == (16, 2 * 144)
    y = dequantize(q, QT.Q4_K)
    rmse = float(np.sqrt(np.mean((y - x) ** 2)))
    assert rmse < 0.085  # 4-bit with a searched (scale, min) per 32 values on N(0, 1)
    assert np.array_equal(quantize_q4_k(y), q)  # dequantized values re-quantize to the same blocks


def test_q4_k_zeros_and_bad_shape() -> None:
    q = quantize_q4_k(np.zeros((2, 256), np.float32))
    assert not dequantize(q, QT.Q4_K).any()
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize_q4_k(np.zeros((1, 100), np.float32))


def test_q5_k_roundtrip_error_and_layout() -> None:
    """Q5_K: the Q4_K search on 5-bit values; gguf-py's dequantizer reads our 5th bits back (a wrong
    qh packing would move half the values by 16 steps), at about half Q4_K's error."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((16, 512)).astype(np.float32)
    x[3, 256:288] = 0.25  # a constant sub-block
    q = quantize_q5_k(x)
    assert q.shape == (16, 2 * 176)
    y = dequantize(q, QT.Q5_K)
    rmse = float(np.sqrt(np.mean((y - x) ** 2)))
    rmse4 = float(np.sqrt(np.mean((dequantize(quantize_q4_k(x), QT.Q4_K) - x) ** 2)))
    assert rmse < 0.6 * rmse4 and rmse < 0.045, (rmse, rmse4)
    assert (q.reshape(-1, 176)[:, 16:48] != 0).any()  # the 5th bits are used
    assert np.abs(y[3, 256:288] - 0.25).max() < 1e-3  # a constant sub-block comes back


def test_q6_k_fixture_quantizer_roundtrip() -> None:
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((8, 512)) * rng.uniform(0.1, 3, (8, 1))).astype(np.float32)
    x[0, :16] = 0.0  # a zero sub-block: scale 0
    q = quantize_q6_k(x)
    assert q.shape == (8, 2 * 210)
    y = dequantize(q, QT.Q6_K)
    step = np.abs(x).reshape(-1, 16).max(axis=1) / 31  # per 16 values
    err = np.abs(y - x).reshape(-1, 16).max(axis=1)
    assert np.all(err <= 0.5 * step * 1.1 + 1e-7)  # half a step (+ the int8 rounding of the scale)
    assert not y[0, :16].any()


@pytest.mark.parametrize("qtype,step_of", [(QT.Q3_K, lambda a: a.reshape(-1, 16).max(axis=1) / 3),
                                           (QT.IQ4_NL, lambda a: a.reshape(-1, 32).max(axis=1) * 24 / 127)],
                         ids=["Q3_K", "IQ4_NL"])
def test_q3_k_and_iq4_nl_fixture_quantizers_roundtrip(qtype: QT, step_of) -> None:  # type: ignore[no-untyped-def]
    """Through gguf-py's dequantizer: each value within half a grid step (IQ4_NL: its widest table gap;
    Q3_K: + the 6-bit rounding of the scale)."""
    from engine.quant.quantize import quantize_as

    rng = np.random.default_rng(13)
    x = (rng.standard_normal((6, 512)) * rng.uniform(0.1, 3, (6, 1))).astype(np.float32)
    x[0, :32] = 0.0
    y = dequantize(quantize_as(qtype, x), qtype)
    group = 16 if qtype == QT.Q3_K else 32
    err = np.abs(y - x).reshape(-1, group).max(axis=1)
    assert np.all(err <= 0.5 * step_of(np.abs(x)) * 1.2 + 1e-6)
    assert not y[0, :32].any() and np.abs(y).max() > 0
