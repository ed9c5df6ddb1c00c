"""numba kernels that compute directly on GGUF quantized blocks (Q8_0, Q5_0, Q4_K, Q6_K).

A weight is the 2-D uint8 array [out_features, row_bytes] exactly as the GGUF stores it (a memmap
view: no copy, resident bytes == file bytes). f16 block scales are decoded through a 65,536-entry
float32 table (`F16_LUT`): numba has no float16 type.

Kernels, all parallel over output rows (prange):
- `gemm_<t>(w, x, out, lut, qk)`: out[B, out] = x[B, in] @ W.T. Per row and per activation row b,
  each block is unpacked in registers and reduced (float32) in a fixed order; the block partial
  sums are accumulated in block order. Row b's arithmetic depends only on W and x[b]: one compiled
  loop for every B, so a row is bit-identical whether computed alone or in a batch.
- `dq_rows_<t>(w, rows, out, lut, qk)`: dequantize selected rows to float32 (embedding take,
  prefill tiles for BLAS, full dequantize). Matches gguf.quants.dequantize exactly.

`qk` (always 32) is passed at run time on purpose: with a compile-time trip count LLVM fully
unrolls the 32-wide block loops and then fails to vectorise them (it cannot prove the output and
the weight bytes do not alias); a run-time count keeps the loop vectoriser (with alias checks).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

QK = 32  # Q8_0 / Q5_0 block size, K-quant sub-block size
QK_K = 256  # K-quant super-block size
BLOCK_BYTES = {"Q8_0": 34, "Q5_0": 22, "Q4_K": 144, "Q6_K": 210}
BLOCK_SIZE = {"Q8_0": QK, "Q5_0": QK, "Q4_K": QK_K, "Q6_K": QK_K}

F16_LUT = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


U = np.uint64  # unsigned indices: numba emits no negative-index wraparound for them, so the
# inner loops stay contiguous vector loads instead of gathers


@njit(inline="always", cache=True)
def _f16(w, r, off, lut):
    return lut[np.int64(w[r, off]) | (np.int64(w[r, off + 1]) << 8)]


@njit(inline="always", cache=True)
def _i8(v):
    v = np.int32(v)
    return v - ((v & 128) << 1)  # uint8 bits -> int8 value


@njit(inline="always", cache=True)
def _k4_scale_min(w, r, s, j):
    """Q4_K packed 6-bit (scale, min) of sub-block j (llama.cpp get_scale_min_k4)."""
    if j < 4:
        return np.int32(w[r, s + j]) & 63, np.int32(w[r, s + j + 4]) & 63
    sc = (np.int32(w[r, s + j + 4]) & 15) | ((np.int32(w[r, s + j - 4]) >> 6) << 4)
    m = (np.int32(w[r, s + j + 4]) >> 4) | ((np.int32(w[r, s + j]) >> 6) << 4)
    return sc, m


# ---- GEMV / batched GEMM ----------------------------------------------------------------------


@njit(parallel=True, fastmath=True, cache=True)
def gemm_q8_0(w, x, out, lut, qk):
    wi = w.view(np.int8)  # int8 -> float32 converts in one vector step (no 64-bit integer lanes)
    n = x.shape[1]
    nb = n // qk
    for o in prange(w.shape[0]):
        wr = wi[o]
        for b in range(x.shape[0]):
            xr = x[b]
            acc = np.float32(0.0)
            for blk in range(nb):
                p = blk * (qk + 2)
                d = _f16(w, o, p, lut)
                q = U(p + 2)
                base = U(blk * qk)
                s = np.float32(0.0)
                for j in range(qk):
                    uj = U(j)
                    s += np.float32(wr[q + uj]) * xr[base + uj]
                acc += d * s
            out[b, o] = acc


@njit(parallel=True, fastmath=True, cache=True)
def gemm_q5_0(w, x, out, lut, qk):
    n = x.shape[1]
    nb = n // qk
    h = qk >> 1
    for o in prange(w.shape[0]):
        wr = w[o]
        for b in range(x.shape[0]):
            xr = x[b]
            acc = np.float32(0.0)
            for blk in range(nb):
                p = blk * (h + 6)
                d = _f16(w, o, p, lut)
                qh = (np.uint32(wr[p + 2]) | (np.uint32(wr[p + 3]) << np.uint32(8))
                      | (np.uint32(wr[p + 4]) << np.uint32(16)) | (np.uint32(wr[p + 5]) << np.uint32(24)))
                q = U(p + 6)
                base = U(blk * qk)
                base2 = base + U(h)
                s = np.float32(0.0)
                for j in range(h):
                    uj = U(j)
                    v = wr[q + uj]
                    jj = np.uint32(j)
                    lo = np.float32(np.uint32(v & np.uint8(15)) | (((qh >> jj) & np.uint32(1)) << np.uint32(4)))
                    hi = np.float32(np.uint32(v >> np.uint8(4))
                                    | (((qh >> (jj + np.uint32(16))) & np.uint32(1)) << np.uint32(4)))
                    s += (lo - np.float32(16)) * xr[base + uj] + (hi - np.float32(16)) * xr[base2 + uj]
                acc += d * s
            out[b, o] = acc


@njit(parallel=True, fastmath=True, cache=True)
def gemm_q4_k(w, x, out, lut, qk):
    n = x.shape[1]
    nsb = n // (8 * qk)
    B = x.shape[0]
    # Per 32-value sub-block sums of x: the "- dmin*m" term is dmin*m*sum(x).
    xs = np.empty((B, n // qk), dtype=np.float32)
    for b in range(B):
        for g in range(n // qk):
            t = np.float32(0.0)
            for j in range(qk):
                t += x[b, g * qk + j]
            xs[b, g] = t
    for o in prange(w.shape[0]):
        wr = w[o]
        for b in range(B):
            xr = x[b]
            acc = np.float32(0.0)
            for sb in range(nsb):
                p = sb * 144
                d = _f16(w, o, p, lut)
                dmin = _f16(w, o, p + 2, lut)
                for c in range(4):  # 64 values: sub-block 2c (low nibbles), 2c+1 (high nibbles)
                    sc0, m0 = _k4_scale_min(w, o, p + 4, 2 * c)
                    sc1, m1 = _k4_scale_min(w, o, p + 4, 2 * c + 1)
                    q = U(p + 16 + c * qk)
                    base = U(sb * 8 * qk + c * 2 * qk)
                    base2 = base + U(qk)
                    s0 = np.float32(0.0)
                    s1 = np.float32(0.0)
                    for l in range(qk):
                        ul = U(l)
                        # nibbles split in float32 (exact): no 64-bit integer lanes in the loop
                        v = np.float32(wr[q + ul])
                        hi = np.floor(v * np.float32(0.0625))
                        s0 += (v - np.float32(16) * hi) * xr[base + ul]
                        s1 += hi * xr[base2 + ul]
                    g = sb * 8 + 2 * c
                    acc += (d * np.float32(sc0)) * s0 - (dmin * np.float32(m0)) * xs[b, g]
                    acc += (d * np.float32(sc1)) * s1 - (dmin * np.float32(m1)) * xs[b, g + 1]
            out[b, o] = acc


@njit(parallel=True, fastmath=True, cache=True)
def gemm_q6_k(w, x, out, lut, qk):
    n = x.shape[1]
    nsb = n // (8 * qk)
    h = qk >> 1
    for o in prange(w.shape[0]):
        wr = w[o]
        for b in range(x.shape[0]):
            xr = x[b]
            acc = np.float32(0.0)
            for sb in range(nsb):
                p = sb * 210
                d = _f16(w, o, p + 208, lut)
                for half in range(2):  # 128 values each
                    sc = p + 192 + 8 * half
                    for g in range(2):  # l in [16g, 16g+16): one scale per quarter
                        ql = U(p + 64 * half + g * h)
                        qh = U(p + 128 + 32 * half + g * h)
                        base = U(sb * 8 * qk + 128 * half + g * h)
                        s0 = np.float32(0.0)
                        s1 = np.float32(0.0)
                        s2 = np.float32(0.0)
                        s3 = np.float32(0.0)
                        for k in range(h):
                            uk = U(k)
                            # bit fields split in float32 (exact): floor(v / 16), floor(v / 4), ...
                            a = np.float32(wr[ql + uk])
                            c = np.float32(wr[ql + U(32) + uk])
                            hb = np.float32(wr[qh + uk])
                            ah = np.floor(a * np.float32(0.0625))
                            ch = np.floor(c * np.float32(0.0625))
                            h1 = np.floor(hb * np.float32(0.25))
                            h2 = np.floor(h1 * np.float32(0.25))
                            h3 = np.floor(h2 * np.float32(0.25))
                            i = base + uk
                            s0 += (a - np.float32(16) * ah + np.float32(16) * (hb - np.float32(4) * h1)
                                   - np.float32(32)) * xr[i]
                            s1 += (c - np.float32(16) * ch + np.float32(16) * (h1 - np.float32(4) * h2)
                                   - np.float32(32)) * xr[i + U(32)]
                            s2 += (ah + np.float32(16) * (h2 - np.float32(4) * h3) - np.float32(32)) * xr[i + U(64)]
                            s3 += (ch + np.float32(16) * h3 - np.float32(32)) * xr[i + U(96)]
                        acc += d * (np.float32(_i8(wr[sc + g])) * s0 + np.float32(_i8(wr[sc + g + 2])) * s1
                                    + np.float32(_i8(wr[sc + g + 4])) * s2 + np.float32(_i8(wr[sc + g + 6])) * s3)
            out[b, o] = acc


# ---- dequantize rows --------------------------------------------------------------------------


@njit(parallel=True, fastmath=True, cache=True)
def dq_rows_q8_0(w, rows, out, lut, qk):
    nb = out.shape[1] // qk
    for i in prange(rows.shape[0]):
        r = rows[i]
        for blk in range(nb):
            p = blk * (qk + 2)
            d = _f16(w, r, p, lut)
            for j in range(qk):
                out[i, blk * qk + j] = np.float32(_i8(w[r, p + 2 + j])) * d


@njit(parallel=True, fastmath=True, cache=True)
def dq_rows_q5_0(w, rows, out, lut, qk):
    nb = out.shape[1] // qk
    h = qk >> 1
    for i in prange(rows.shape[0]):
        r = rows[i]
        for blk in range(nb):
            p = blk * (h + 6)
            d = _f16(w, r, p, lut)
            qh = (np.int64(w[r, p + 2]) | (np.int64(w[r, p + 3]) << 8)
                  | (np.int64(w[r, p + 4]) << 16) | (np.int64(w[r, p + 5]) << 24))
            base = blk * qk
            for j in range(h):
                v = np.int64(w[r, p + 6 + j])
                out[i, base + j] = d * np.float32(((v & 15) | (((qh >> j) & 1) << 4)) - 16)
                out[i, base + h + j] = d * np.float32(((v >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16)


@njit(parallel=True, fastmath=True, cache=True)
def dq_rows_q4_k(w, rows, out, lut, qk):
    nsb = out.shape[1] // (8 * qk)
    for i in prange(rows.shape[0]):
        r = rows[i]
        for sb in range(nsb):
            p = sb * 144
            d = _f16(w, r, p, lut)
            dmin = _f16(w, r, p + 2, lut)
            for c in range(4):
                sc0, m0 = _k4_scale_min(w, r, p + 4, 2 * c)
                sc1, m1 = _k4_scale_min(w, r, p + 4, 2 * c + 1)
                d0 = d * np.float32(sc0)
                d1 = d * np.float32(sc1)
                mm0 = dmin * np.float32(m0)
                mm1 = dmin * np.float32(m1)
                q = p + 16 + c * qk
                base = sb * 8 * qk + c * 2 * qk
                for l in range(qk):
                    v = np.int32(w[r, q + l])
                    out[i, base + l] = d0 * np.float32(v & 15) - mm0
                    out[i, base + qk + l] = d1 * np.float32(v >> 4) - mm1


@njit(parallel=True, fastmath=True, cache=True)
def dq_rows_q6_k(w, rows, out, lut, qk):
    nsb = out.shape[1] // (8 * qk)
    h = qk >> 1
    for i in prange(rows.shape[0]):
        r = rows[i]
        for sb in range(nsb):
            p = sb * 210
            d = _f16(w, r, p + 208, lut)
            for half in range(2):
                ql = p + 64 * half
                qh = p + 128 + 32 * half
                sc = p + 192 + 8 * half
                base = sb * 8 * qk + 128 * half
                for g in range(2):
                    d0 = d * np.float32(_i8(w[r, sc + g]))
                    d1 = d * np.float32(_i8(w[r, sc + g + 2]))
                    d2 = d * np.float32(_i8(w[r, sc + g + 4]))
                    d3 = d * np.float32(_i8(w[r, sc + g + 6]))
                    for k in range(h):
                        l = g * h + k
                        a = np.int32(w[r, ql + l])
                        c = np.int32(w[r, ql + l + 32])
                        hb = np.int32(w[r, qh + l])
                        out[i, base + l] = d0 * np.float32(((a & 15) | ((hb & 3) << 4)) - 32)
                        out[i, base + l + 32] = d1 * np.float32(((c & 15) | (((hb >> 2) & 3) << 4)) - 32)
                        out[i, base + l + 64] = d2 * np.float32(((a >> 4) | (((hb >> 4) & 3) << 4)) - 32)
                        out[i, base + l + 96] = d3 * np.float32(((c >> 4) | (((hb >> 6) & 3) << 4)) - 32)


GEMM = {"Q8_0": gemm_q8_0, "Q5_0": gemm_q5_0, "Q4_K": gemm_q4_k, "Q6_K": gemm_q6_k}
DQ_ROWS = {"Q8_0": dq_rows_q8_0, "Q5_0": dq_rows_q5_0, "Q4_K": dq_rows_q4_k, "Q6_K": dq_rows_q6_k}
