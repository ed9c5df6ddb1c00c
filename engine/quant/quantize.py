"""Vectorized numpy quantizers for Q8_0, Q4_K and Q5_K, producing llama.cpp's reference blocks.

Used to build quantized fixtures of any shape (tests, benches). Q8_0 is bit-exact with
ggml's quantize_row_q8_0_ref (and gguf.quants.quantize). Q4_K follows quantize_row_q4_K_ref:
per 32-value sub-block a weighted least-squares search over 21 candidate scales for (scale, min)
(llama.cpp's make_qkx2_quants: weights av|x| + |x_i|, rmin=-1, rdelta=0.1, nstep=20), then the
eight scales and mins are quantized to 6 bits against the super-block's f16 d / dmin and the
values re-rounded against the rounded scales. Q5_K is the same search with 5-bit values
(quantize_row_q5_K_ref: nmax 31, rmin -0.5, 15 steps). Arithmetic is float32 like the C code; sums are
numpy's (pairwise), so a rare block can differ from C in the last rounding.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType as QT

QK8_0 = 32
QK_K = 256


def _round_away(v: np.ndarray) -> np.ndarray:
    """C roundf: halves away from zero."""
    return np.trunc(v + np.copysign(np.float32(0.5), v)).astype(np.float32)


def _nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml nearest_int (the 1.5*2^23 trick): round half to even, in float32."""
    return np.rint(v.astype(np.float32)).astype(np.int32)


def _rows(x: np.ndarray, block: int) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[1] % block:
        raise ValueError(f"quantize: row length {x.shape[-1]} is not a multiple of {block}")
    return np.ascontiguousarray(x)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """float32 [rows, n] -> uint8 [rows, n/32*34] Q8_0 blocks (f16 d, 32 x int8)."""
    x = _rows(x, QK8_0)
    rows, n = x.shape
    blocks = x.reshape(-1, QK8_0)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = _round_away(blocks * inv).astype(np.int8)
    out = np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], axis=1)
    return out.reshape(rows, n // QK8_0 * 34)


def make_qkx2_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float,
                     nstep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorized over groups: x, w [G, n] -> (L uint8 [G, n], scale [G], the_min [G] (>= 0)).

    Weighted least squares for x ~ scale*L + min with L in [0, nmax], min <= 0: start from the
    min/max grid, then try iscale = (nmax + rmin + rdelta*k) / (max - min) for k = 0..nstep,
    solve the 2x2 normal equations for each candidate L and keep the lowest weighted error.
    """
    f32 = np.float32
    x = x.astype(f32)
    w = w.astype(f32)
    mn = np.minimum(x.min(axis=1), f32(0))
    mx = x.max(axis=1)
    flat = mx == mn
    sum_w = w.sum(axis=1, dtype=f32)
    sum_x = (w * x).sum(axis=1, dtype=f32)

    rng = np.where(flat, f32(1), mx - mn).astype(f32)
    iscale = (f32(nmax) / rng).astype(f32)
    scale = (f32(1) / iscale).astype(f32)
    L = np.clip(_nearest_int(iscale[:, None] * (x - mn[:, None])), 0, nmax)
    diff = scale[:, None] * L.astype(f32) + mn[:, None] - x
    best = (w * diff * diff).sum(axis=1, dtype=f32)
    for k in range(nstep + 1):
        # As in the C code, a better candidate's min also moves the grid of the next candidates.
        rng = np.where(flat, f32(1), mx - mn).astype(f32)
        isc = ((f32(rmin) + f32(rdelta) * f32(k) + f32(nmax)) / rng).astype(f32)
        la = np.clip(_nearest_int(isc[:, None] * (x - mn[:, None])), 0, nmax)
        lf = la.astype(f32)
        sum_l = (w * lf).sum(axis=1, dtype=f32)
        sum_l2 = (w * lf * lf).sum(axis=1, dtype=f32)
        sum_xl = (w * lf * x).sum(axis=1, dtype=f32)
        D = sum_w * sum_l2 - sum_l * sum_l
        ok = D > 0
        Ds = np.where(ok, D, f32(1))
        this_scale = ((sum_w * sum_xl - sum_x * sum_l) / Ds).astype(f32)
        this_min = ((sum_l2 * sum_x - sum_l * sum_xl) / Ds).astype(f32)
        pos = this_min > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            this_scale = np.where(pos, sum_xl / np.where(sum_l2 == 0, f32(1), sum_l2), this_scale).astype(f32)
        this_min = np.where(pos, f32(0), this_min).astype(f32)
        diff = this_scale[:, None] * lf + this_min[:, None] - x
        cur = (w * diff * diff).sum(axis=1, dtype=f32)
        take = ok & (cur < best) & ~flat
        L = np.where(take[:, None], la, L)
        best = np.where(take, cur, best)
        scale = np.where(take, this_scale, scale)
        mn = np.where(take, this_min, mn)
    L = np.where(flat[:, None], 0, L)
    scale = np.where(flat, f32(0), scale).astype(f32)
    the_min = mn
    return L.astype(np.uint8), scale, (-the_min).astype(f32)


def _pack_k4_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """6-bit scales and mins [N, 8] -> the 12-byte Q4_K layout (get_scale_min_k4 inverse)."""
    out = np.zeros((ls.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    out[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    return out


def _k_quants(x: np.ndarray, nmax: int, rmin: float, nstep: int) -> tuple[np.ndarray, ...]:
    """The Q4_K / Q5_K search (quantize_row_q4_K_ref / q5_K_ref) over super-blocks of x [rows, n]:
    (f16 d [nsb], f16 dmin [nsb], 6-bit scales [nsb, 8], 6-bit mins [nsb, 8], values [nsb, 256])."""
    f32 = np.float32
    nsb = x.size // QK_K
    sub = x.reshape(nsb * 8, 32)
    av = np.sqrt((sub * sub).sum(axis=1, dtype=f32) / f32(32)).astype(f32)
    wts = av[:, None] + np.abs(sub)
    L, scales, mins = make_qkx2_quants(sub, wts, nmax, rmin, 0.1, nstep)
    scales = scales.reshape(nsb, 8)
    mins = mins.reshape(nsb, 8)
    L = L.reshape(nsb, 8, 32).astype(np.int32)

    max_scale = scales.max(axis=1)
    max_min = mins.max(axis=1)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, f32(63) / max_scale, f32(0)).astype(f32)
        inv_min = np.where(max_min > 0, f32(63) / max_min, f32(0)).astype(f32)
    ls = np.minimum(63, _nearest_int(inv_scale[:, None] * scales) & 0xFF).astype(np.uint8)
    lm = np.minimum(63, _nearest_int(inv_min[:, None] * mins) & 0xFF).astype(np.uint8)
    d16 = (max_scale / f32(63)).astype(np.float16)
    dmin16 = (max_min / f32(63)).astype(np.float16)

    # Re-round every value against the scales as they will be decoded.
    d_eff = d16.astype(f32)[:, None] * ls.astype(f32)  # [nsb, 8]
    dm_eff = dmin16.astype(f32)[:, None] * lm.astype(f32)
    xs = sub.reshape(nsb, 8, 32)
    with np.errstate(divide="ignore", invalid="ignore"):
        l2 = np.clip(_nearest_int((xs + dm_eff[:, :, None]) / d_eff[:, :, None]), 0, nmax)
    L = np.where((d_eff != 0)[:, :, None], l2, L).astype(np.uint8)
    return d16, dmin16, ls, lm, L.reshape(nsb, QK_K)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """float32 [rows, n] -> uint8 [rows, n/256*144] Q4_K blocks (f16 d, f16 dmin, 12 scale bytes, 128 qs)."""
    x = _rows(x, QK_K)
    rows, n = x.shape
    d16, dmin16, ls, lm, L = _k_quants(x, 15, -1.0, 20)
    nsb = L.shape[0]
    Lc = L.reshape(nsb, 4, 2, 32)  # 64-value chunks: low nibble = first 32, high = second 32
    qs = (Lc[:, :, 0, :] | (Lc[:, :, 1, :] << 4)).reshape(nsb, 128)
    out = np.concatenate([d16.view(np.uint8).reshape(nsb, 2), dmin16.view(np.uint8).reshape(nsb, 2),
                          _pack_k4_scales(ls, lm), qs], axis=1)
    return out.reshape(rows, n // QK_K * 144)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """float32 [rows, n] -> uint8 [rows, n/256*176] Q5_K blocks (f16 d, f16 dmin, 12 scale bytes,
    qh[32]: bit j of byte l = the 5th bit of value l of sub-block j, qs[128] as Q4_K's nibbles);
    quantize_row_q5_K_ref's search (nmax 31, rmin -0.5, 15 steps)."""
    x = _rows(x, QK_K)
    rows, n = x.shape
    d16, dmin16, ls, lm, L = _k_quants(x, 31, -0.5, 15)
    nsb = L.shape[0]
    Ls = L.reshape(nsb, 8, 32)
    qh = ((Ls >> 4) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)
    Lc = (L & 15).reshape(nsb, 4, 2, 32)
    qs = (Lc[:, :, 0, :] | (Lc[:, :, 1, :] << 4)).reshape(nsb, 128)
    out = np.concatenate([d16.view(np.uint8).reshape(nsb, 2), dmin16.view(np.uint8).reshape(nsb, 2),
                          _pack_k4_scales(ls, lm), qh, qs], axis=1)
    return out.reshape(rows, n // QK_K * 176)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """float32 [rows, n] -> uint8 [rows, n/256*210] Q6_K blocks (ql[128], qh[64], int8 scales[16], f16 d).

    Not llama.cpp's search (make_qx_quants): a plain absmax grid (per 16 values scale = max|x| / 31,
    int8 against the super-block's d = max scale / 127, values rounded against the decoded scale).
    Valid blocks in ggml's layout for fixtures; the packing is dequantize_row_q6_K's inverse."""
    f32 = np.float32
    x = _rows(x, QK_K)
    rows, n = x.shape
    nsb = rows * n // QK_K
    sub = x.reshape(nsb, 16, 16)
    s = np.abs(sub).max(axis=2) / f32(31)  # [nsb, 16]
    d = (s.max(axis=1) / f32(127)).astype(np.float16)
    df = d.astype(f32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df[:, None] > 0, np.clip(_nearest_int(s / df[:, None]), -128, 127), 0).astype(np.int8)
        step = df[:, None] * sc.astype(f32)
        q = np.where(step[:, :, None] > 0, np.clip(_nearest_int(sub / step[:, :, None]), -32, 31), 0)
    return pack_q6_k(q.reshape(nsb, QK_K), sc, d).reshape(rows, n // QK_K * 210)


def pack_q6_k(q: np.ndarray, sc: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Q6_K blocks uint8 [nsb, 210] from values q [nsb, 256] in -32..31 (element order), int8 scales
    [nsb, 16] (one per 16 values) and f16 d [nsb]: dequantize_row_q6_K's inverse."""
    nsb = q.shape[0]
    L = (q.astype(np.int32) + 32).astype(np.uint8).reshape(nsb, 2, 4, 32)  # [super-block, half, quarter, value]
    ql = np.stack([(L[:, :, 0] & 15) | ((L[:, :, 2] & 15) << 4), (L[:, :, 1] & 15) | ((L[:, :, 3] & 15) << 4)], axis=2)
    qh = sum(((L[:, :, k] >> 4) << (2 * k)) for k in range(4)).astype(np.uint8)
    return np.concatenate([ql.reshape(nsb, 128), qh.reshape(nsb, 64), np.ascontiguousarray(sc).view(np.uint8),
                           np.ascontiguousarray(d, dtype=np.float16).view(np.uint8).reshape(nsb, 2)], axis=1)


def quantize_q3_k(x: np.ndarray) -> np.ndarray:
    """float32 [rows, n] -> uint8 [rows, n/256*110] Q3_K blocks (hmask[32], qs[64], 12 scale bytes, f16 d).

    A fixture quantizer like quantize_q6_k (absmax per 16 values: scale = max|x| / 3 as a 6-bit signed
    multiple of d = max scale / 31, q in -3..3 of the type's -4..3), packed as dequantize_row_q3_K reads it."""
    f32 = np.float32
    x = _rows(x, QK_K)
    rows, n = x.shape
    nsb = rows * n // QK_K
    sub = x.reshape(nsb, 16, 16)
    s = np.abs(sub).max(axis=2) / f32(3)
    d = (s.max(axis=1) / f32(31)).astype(np.float16)
    df = d.astype(f32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df[:, None] > 0, np.clip(_nearest_int(s / df[:, None]), -32, 31), 0)
        step = df[:, None] * sc.astype(f32)
        q = np.where(step[:, :, None] > 0, np.clip(_nearest_int(sub / step[:, :, None]), -4, 3), 0).reshape(nsb, QK_K)
    u = (sc + 32).astype(np.uint8)  # [nsb, 16] 6-bit
    scales = np.zeros((nsb, 12), np.uint8)
    scales[:, 0:8] = (u[:, 0:8] & 15) | ((u[:, 8:16] & 15) << 4)
    scales[:, 8:12] = sum(((u[:, 4 * k: 4 * k + 4] >> 4) << (2 * k)) for k in range(4)).astype(np.uint8)
    hbit = (q >= 0).astype(np.uint8).reshape(nsb, 8, 32)  # element 32 j + l: bit j of hmask[l]
    hmask = (hbit << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)
    q2 = (q + 4 * (1 - hbit.reshape(nsb, QK_K))).astype(np.uint8).reshape(nsb, 2, 4, 32)  # element 128 h + 32 s + l
    qs = sum((q2[:, :, k] << (2 * k)) for k in range(4)).astype(np.uint8).reshape(nsb, 64)
    out = np.concatenate([hmask, qs, scales, d.view(np.uint8).reshape(nsb, 2)], axis=1)
    return out.reshape(rows, n // QK_K * 110)


def quantize_iq4_nl(x: np.ndarray) -> np.ndarray:
    """float32 [rows, n] -> uint8 [rows, n/32*18] IQ4_NL blocks: a fixture quantizer (d = -max|x| / 127
    signed like the block's extreme value, each value the nearest table entry), not llama.cpp's search."""
    from engine.quant.iquant import IQ4_VALUES

    f32 = np.float32
    x = _rows(x, QK8_0)
    rows, n = x.shape
    b = x.reshape(-1, QK8_0)
    ext = np.take_along_axis(b, np.abs(b).argmax(axis=1)[:, None], axis=1)[:, 0]
    d = (ext / f32(-127)).astype(np.float16)
    table = IQ4_VALUES.astype(f32)
    q = np.abs(d.astype(f32)[:, None, None] * table[None, None, :] - b[:, :, None]).argmin(axis=2).astype(np.uint8)
    out = np.concatenate([d.view(np.uint8).reshape(-1, 2), q[:, :16] | (q[:, 16:] << 4)], axis=1)
    return out.reshape(rows, n // QK8_0 * 18)


def quantize_as(qtype: QT, x: np.ndarray) -> np.ndarray:
    """float32 [rows, n] -> GGUF bytes uint8 [rows, row_bytes] of qtype: the quantizers here for Q8_0,
    Q4_K, Q5_K, Q6_K, Q3_K, IQ4_NL, numpy's cast for F16, gguf-py's for the rest it can quantize (Q4_0, Q4_1,
    Q5_0, Q5_1, BF16, ...). For fixtures and kernel checks of any resident type."""
    from gguf.quants import quantize

    x = np.ascontiguousarray(x, dtype=np.float32)
    if qtype == QT.F16:
        return x.astype(np.float16).view(np.uint8)
    own = {QT.Q8_0: quantize_q8_0, QT.Q4_K: quantize_q4_k, QT.Q5_K: quantize_q5_k, QT.Q6_K: quantize_q6_k,
           QT.Q3_K: quantize_q3_k, QT.IQ4_NL: quantize_iq4_nl}
    return own[qtype](x) if qtype in own else quantize(x, qtype)
