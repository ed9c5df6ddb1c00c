"""numba kernels on GGUF quantized blocks (Q8_0, Q5_0, Q4_K, Q6_K): dequantizers and block constants.

A weight is the 2-D uint8 array [out_features, row_bytes] exactly as the GGUF stores it (a memmap
view: no copy). f16 block scales are decoded through a 65,536-entry float32 table (`F16_LUT`):
numba has no float16 type.

- The float32 product on these blocks, `gemm(w, x, out, lut, kind)`, lives in engine/kernels/blockdot.py
  (LLVM vector IR, one block unpacked once per group of lanes). Resident weights
  use it only under FAK_TILES=0: by default they are repacked into 16-row tiles and multiplied on
  int16 dots (engine/quant/tiles.py, tiledot.py, tilegemm.py).
- `dq_rows_<t>(w, rows, out, lut, qk)`: selected rows as float32 (embedding take, prefill tiles for
  BLAS, full dequantize); they match gguf.quants.dequantize.
- `repack_q5_0_q8_0`: Q5_0 blocks -> Q8_0 blocks of the same values (see engine/model/resident.py).

Speed notes for the dequantizers (measured): indices are unsigned (`U`) so numba emits no
negative-index fix-up and LLVM keeps contiguous vector loads instead of gathers; `qk` (always 32)
is passed at run time because with a compile-time trip count LLVM fully unrolls the 32-wide block
loops and then fails to vectorise them; bit fields are split in float32 (floor(v/16) ..., exact) or
in explicit int32, avoiding 64-bit integer lanes. Quantizing activations to int8 (llama.cpp's q8_0
dot) was measured and rejected: max |logit diff| 0.59 vs float32 on Gemma (bound: 0.05); int16,
what the tile kernels do, moves them by 0.002.
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


# ---- row unpackers -----------------------------------------------------------------------------


@njit(inline="always", fastmath=True, cache=True)
def _unpack_q8_0(w, r, buf, lut, qk):
    wr = w[r].view(np.int8)
    for blk in range(buf.shape[0] // qk):
        p = blk * (qk + 2)
        d = _f16(w, r, p, lut)
        q = U(p + 2)
        base = U(blk * qk)
        for j in range(qk):
            uj = U(j)
            buf[base + uj] = np.float32(wr[q + uj]) * d


@njit(inline="always", fastmath=True, cache=True)
def _unpack_q5_0(w, r, buf, lut, qk):
    wr = w[r]
    h = qk >> 1
    for blk in range(buf.shape[0] // qk):
        p = blk * (h + 6)
        d = _f16(w, r, p, lut)
        # the 5th bits: low 16 for values 0..15, high 16 for values 16..31 (int32 keeps lanes narrow)
        qlo = np.int32(wr[p + 2]) | (np.int32(wr[p + 3]) << 8)
        qhi = np.int32(wr[p + 4]) | (np.int32(wr[p + 5]) << 8)
        q = U(p + 6)
        base = U(blk * qk)
        base2 = base + U(h)
        for j in range(h):
            uj = U(j)
            v = np.int32(wr[q + uj])
            b0 = np.int32((qlo >> j) & 1)
            b1 = np.int32((qhi >> j) & 1)
            buf[base + uj] = d * np.float32(np.int32((v & 15) + 16 * b0 - 16))
            buf[base2 + uj] = d * np.float32(np.int32((v >> 4) + 16 * b1 - 16))


@njit(inline="always", fastmath=True, cache=True)
def _unpack_q4_k(w, r, buf, lut, qk):
    wr = w[r]
    for sb in range(buf.shape[0] // (8 * qk)):
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
            q = U(p + 16 + c * qk)
            base = U(sb * 8 * qk + c * 2 * qk)
            base2 = base + U(qk)
            for l in range(qk):
                ul = U(l)
                v = np.float32(wr[q + ul])
                hi = np.floor(v * np.float32(0.0625))
                buf[base + ul] = d0 * (v - np.float32(16) * hi) - mm0
                buf[base2 + ul] = d1 * hi - mm1


@njit(inline="always", fastmath=True, cache=True)
def _unpack_q6_k(w, r, buf, lut, qk):
    wr = w[r]
    h = qk >> 1
    for sb in range(buf.shape[0] // (8 * qk)):
        p = sb * 210
        d = _f16(w, r, p + 208, lut)
        for half in range(2):
            sc = p + 192 + 8 * half
            for g in range(2):
                d0 = d * np.float32(_i8(wr[sc + g]))
                d1 = d * np.float32(_i8(wr[sc + g + 2]))
                d2 = d * np.float32(_i8(wr[sc + g + 4]))
                d3 = d * np.float32(_i8(wr[sc + g + 6]))
                ql = U(p + 64 * half + g * h)
                qh = U(p + 128 + 32 * half + g * h)
                base = U(sb * 8 * qk + 128 * half + g * h)
                for k in range(h):
                    uk = U(k)
                    a = np.float32(wr[ql + uk])
                    c = np.float32(wr[ql + U(32) + uk])
                    hb = np.float32(wr[qh + uk])
                    ah = np.floor(a * np.float32(0.0625))
                    ch = np.floor(c * np.float32(0.0625))
                    h1 = np.floor(hb * np.float32(0.25))
                    h2 = np.floor(h1 * np.float32(0.25))
                    h3 = np.floor(h2 * np.float32(0.25))
                    i = base + uk
                    buf[i] = d0 * (a - np.float32(16) * ah + np.float32(16) * (hb - np.float32(4) * h1) - np.float32(32))
                    buf[i + U(32)] = d1 * (c - np.float32(16) * ch + np.float32(16) * (h1 - np.float32(4) * h2)
                                           - np.float32(32))
                    buf[i + U(64)] = d2 * (ah + np.float32(16) * (h2 - np.float32(4) * h3) - np.float32(32))
                    buf[i + U(96)] = d3 * (ch + np.float32(16) * h3 - np.float32(32))


KIND = {"Q8_0": 0, "Q5_0": 1, "Q4_K": 2, "Q6_K": 3}  # `gemm`'s kind argument


@njit(parallel=True, fastmath=True, cache=True)
def dq_rows_q8_0(w, rows, out, lut, qk):
    for i in prange(rows.shape[0]):
        _unpack_q8_0(w, rows[i], out[i], lut, qk)


@njit(parallel=True, fastmath=True, cache=True)
def dq_rows_q5_0(w, rows, out, lut, qk):
    for i in prange(rows.shape[0]):
        _unpack_q5_0(w, rows[i], out[i], lut, qk)


@njit(parallel=True, fastmath=True, cache=True)
def dq_rows_q4_k(w, rows, out, lut, qk):
    for i in prange(rows.shape[0]):
        _unpack_q4_k(w, rows[i], out[i], lut, qk)


@njit(parallel=True, fastmath=True, cache=True)
def dq_rows_q6_k(w, rows, out, lut, qk):
    for i in prange(rows.shape[0]):
        _unpack_q6_k(w, rows[i], out[i], lut, qk)


@njit(parallel=True, cache=True)
def repack_q5_0_q8_0(src, dst):
    """Q5_0 blocks [rows, nb*22] -> Q8_0 blocks [rows, nb*34] holding exactly the same values.

    Same f16 scale d, and q8 = (nibble | 5th bit << 4) - 16 in [-16, 15]: d * q8 is the Q5_0 value
    bit for bit, so the Q8_0 kernels give the results the Q5_0 ones would, faster (Q5_0's 16-wide
    bit games keep LLVM from vectorising well; measured in bench/decode.py)."""
    rows = src.shape[0]
    nb = src.shape[1] // 22
    for r in prange(rows):
        for blk in range(nb):
            p = blk * 22
            q = blk * 34
            dst[r, q] = src[r, p]
            dst[r, q + 1] = src[r, p + 1]
            qh = np.int64(src[r, p + 2]) | (np.int64(src[r, p + 3]) << 8) | (np.int64(src[r, p + 4]) << 16) \
                | (np.int64(src[r, p + 5]) << 24)
            for j in range(16):
                v = np.int64(src[r, p + 6 + j])
                lo = (v & 15) | (((qh >> j) & 1) << 4)
                hi = (v >> 4) | (((qh >> (j + 16)) & 1) << 4)
                dst[r, q + 2 + j] = np.uint8((lo - 16) & 255)
                dst[r, q + 18 + j] = np.uint8((hi - 16) & 255)


DQ_ROWS = {"Q8_0": dq_rows_q8_0, "Q5_0": dq_rows_q5_0, "Q4_K": dq_rows_q4_k, "Q6_K": dq_rows_q6_k}
