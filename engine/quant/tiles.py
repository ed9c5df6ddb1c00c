"""16-row tile layouts of the GGUF quant types, for the integer-dot decode kernels (engine/kernels/tiledot.py).

A weight [rows, n] becomes [ceil(rows / 16), n_super * SB_BYTES] uint8: one array row per tile of
16 weight rows (the last tile padded with zero rows), each a run of super-blocks of SB values
(32 for Q8_0 / Q5_0, 256 for the K-quants). A super-block is a header, then one "tile block" per
32 values. Inside a tile block, "pair k" (k < 16) means values 2k and 2k+1 of all 16 rows: the
32 numbers one `vpdpwssd` multiplies with a broadcast activation pair. Byte 2i + h of a pair's
32-byte vector belongs to row i, value 2k + h.

- Q8_0x16 (SB 32, 544 bytes = 16 x 34): f16 d[16]; int8 q: pair k at 32 + 32k.
- Q5_0x16 (SB 32, 352 = 16 x 22): f16 d[16]; nibbles (below); 5th bits: 2 vectors of 32 bytes,
  bit f of vector m = bit 4 of pair 8m + f. Value = d * (q - 16).
- Q6_Kx16 (SB 256, 3360 = 16 x 210): f16 d[16]; 8 tile blocks of 416: int8 scales [2][16] (values
  0..15 and 16..31 of the block: GGUF's one scale per 16), nibbles, high bits: 4 vectors of 32
  bytes, bits 2f..2f+1 of vector m = bits 4..5 of pair 4m + f. Value = d * scale * (q - 32).
- Q4_Kx16 (SB 256, 2368 = 16 x 148): f16 d[16], f16 dmin[16]; 8 tile blocks of 288: u8 scale[16],
  u8 min[16] (GGUF's 6-bit fields, unpacked: +4 bytes per 144), nibbles. Value = d*sc*q - dmin*m.
- Nibbles (256 bytes): 8 vectors of 32 bytes; vector g holds pair g in the low nibbles and pair
  g + 8 in the high ones.
- Q4_0x16 (SB 32, 288 = 16 x 18): f16 d[16]; nibbles. Value = d * (q - 8).
- Q4_1x16 (SB 32, 320 = 16 x 20): f16 d[16], f16 m[16]; nibbles. Value = d * q + m.
- Q5_1x16 (SB 32, 384 = 16 x 24): f16 d[16], f16 m[16]; nibbles; 5th bits as Q5_0's. Value = d * q + m.
- Q5_Kx16 (SB 256, 2880 = 16 x 180): Q4_Kx16's header; 8 tile blocks of 352: u8 scale[16], u8 min[16],
  nibbles, 5th bits as Q5_0's. Value = d*sc*q - dmin*m.
- F16x16 / BF16x16 (SB 32, 1024 = 16 x 64): vector j (32 bytes) holds value j of the 16 rows, as
  the GGUF's 16-bit floats (no pairs: these are multiplied as floats, tiledot.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from engine.quant.rows import _k4_scale_min  # Q4_K's 6-bit (scale, min) fields

TILE = 16  # rows per tile: one zmm of int32 row sums
QB = 32  # values per tile block
# tile kind codes 0..9 (0..3 as kernels.KIND); FLOAT_KINDS and up hold floats, not integers
KINDS = ("Q8_0", "Q5_0", "Q4_K", "Q6_K", "Q4_0", "Q4_1", "Q5_1", "Q5_K", "F16", "BF16")
FLOAT_KINDS = 8
# Kind groups, each compiled into the tile kernels as one specialisation (a literal bit mask of kind codes):
# a model compiles only its weights' groups. Q4_K_M / Q6_K / Q8_0 files (the packaged models) use the
# first alone; the second holds the legacy and Q5_K types, the third the float tiles. (One specialisation
# per kind measured slower: each pays the kernel's own compile again.)
KIND_GROUPS = (0x00F, 0x0F0, 0x300)
ALL_KINDS = 0x3FF
SB_VALUES = (32, 32, 256, 256, 32, 32, 32, 256, 32, 32)
SB_BYTES = (544, 352, 2368, 3360, 288, 320, 384, 2880, 1024, 1024)
HEADER = (0, 0, 64, 32, 0, 0, 0, 64, 0, 0)  # super-block header bytes (else the scales sit in the tile block)
TB_BYTES = (544, 352, 288, 416, 288, 320, 384, 352, 1024, 1024)
GGUF_BYTES = (34, 22, 144, 210, 18, 20, 24, 176, 64, 64)  # per row and super-block in the GGUF
NIB = (0, 32, 32, 32, 32, 64, 64, 32, 0, 0)  # offset of the nibble vectors in a tile block (after the scales)
HBITS = (0, 1, 0, 2, 0, 0, 1, 1, 0, 0)  # high bits per value above the nibble
OFFSET = (0, 16, 0, 32, 8, 0, 0, 0, 0, 0)  # subtracted from the unsigned value (signed types)


def kind_group(kind: int) -> int:
    """The bit mask of the kind group holding tile kind `kind` (KIND_GROUPS)."""
    for g in KIND_GROUPS:
        if g >> kind & 1:
            return g
    raise ValueError(f"no tile kind {kind}")


def tiled_shape(kind: int, rows: int, n: int) -> tuple[int, int]:
    return -(-rows // TILE), n // SB_VALUES[kind] * SB_BYTES[kind]


@njit(inline="always", cache=True)
def _f16_copy(src, r, s, dst, t, o, i):  # type: ignore[no-untyped-def]
    dst[t, o + 2 * i] = src[r, s]
    dst[t, o + 2 * i + 1] = src[r, s + 1]


@njit(inline="always", cache=True)
def _put_values(dst, t, o, i, q, base, hbits):  # type: ignore[no-untyped-def]
    """Row i's 32 unsigned values q[base:base + 32] into the nibble (+ high-bit) vectors at o."""
    per = 8 // hbits if hbits else 16
    for k in range(16):
        for h in range(2):
            v = np.int32(q[base + 2 * k + h])
            pos = o + 32 * (k % 8) + 2 * i + h
            if k < 8:
                dst[t, pos] = (dst[t, pos] & 0xF0) | (v & 15)
            else:
                dst[t, pos] = (dst[t, pos] & 0x0F) | ((v & 15) << 4)
            if hbits:
                hp = o + 256 + 32 * (k // per) + 2 * i + h
                dst[t, hp] = dst[t, hp] | (((v >> 4) & ((1 << hbits) - 1)) << (hbits * (k % per)))


@njit(inline="always", cache=True)
def _repack_row(kind, src, r, dst, t, i, q):  # type: ignore[no-untyped-def]
    """GGUF row r (all its super-blocks) -> row i of tile t; q is a scratch of 256 values."""
    nsb = src.shape[1] // GGUF_BYTES[kind]
    for sb in range(nsb):
        s, o = sb * GGUF_BYTES[kind], sb * SB_BYTES[kind]
        if kind == 0:
            _f16_copy(src, r, s, dst, t, o, i)
            for k in range(16):
                dst[t, o + 32 + 32 * k + 2 * i] = src[r, s + 2 + 2 * k]
                dst[t, o + 32 + 32 * k + 2 * i + 1] = src[r, s + 3 + 2 * k]
        elif kind == 1:
            _f16_copy(src, r, s, dst, t, o, i)
            qh = np.int64(0)
            for b in range(4):
                qh |= np.int64(src[r, s + 2 + b]) << (8 * b)
            for j in range(16):
                lo = np.int32(src[r, s + 6 + j])
                q[j] = (lo & 15) | (((qh >> j) & 1) << 4)
                q[j + 16] = (lo >> 4) | (((qh >> (j + 16)) & 1) << 4)
            _put_values(dst, t, o + 32, i, q, 0, 1)
        elif kind == 2 or kind == 7:  # Q4_K / Q5_K: d, dmin, 6-bit scales, (Q5_K: qh[32]), qs[128]
            _f16_copy(src, r, s, dst, t, o, i)  # d
            _f16_copy(src, r, s + 2, dst, t, o + 32, i)  # dmin
            qs = s + 16 if kind == 2 else s + 48
            for c in range(4):
                for l in range(32):
                    v = np.int32(src[r, qs + 32 * c + l])
                    h = np.int32(src[r, s + 16 + l]) if kind == 7 else np.int32(0)  # bit j: sub-block j
                    q[64 * c + l] = (v & 15) | (((h >> (2 * c)) & 1) << 4)
                    q[64 * c + 32 + l] = (v >> 4) | (((h >> (2 * c + 1)) & 1) << 4)
            for j in range(8):
                tb = o + 64 + j * TB_BYTES[kind]
                sc, m = _k4_scale_min(src, r, s + 4, j)
                dst[t, tb + i] = sc
                dst[t, tb + 16 + i] = m
                _put_values(dst, t, tb + 32, i, q, 32 * j, HBITS[kind])
        elif kind == 4:  # Q4_0: d, 16 bytes of nibbles
            _f16_copy(src, r, s, dst, t, o, i)
            for j in range(16):
                v = np.int32(src[r, s + 2 + j])
                q[j] = v & 15
                q[j + 16] = v >> 4
            _put_values(dst, t, o + 32, i, q, 0, 0)
        elif kind == 5 or kind == 6:  # Q4_1 / Q5_1: d, m, (Q5_1: u32 of 5th bits), nibbles
            _f16_copy(src, r, s, dst, t, o, i)
            _f16_copy(src, r, s + 2, dst, t, o + 32, i)
            qh = np.int64(0)
            if kind == 6:
                for b in range(4):
                    qh |= np.int64(src[r, s + 4 + b]) << (8 * b)
            qs = s + 4 if kind == 5 else s + 8
            for j in range(16):
                lo = np.int32(src[r, qs + j])
                q[j] = (lo & 15) | (((qh >> j) & 1) << 4)
                q[j + 16] = (lo >> 4) | (((qh >> (j + 16)) & 1) << 4)
            _put_values(dst, t, o + 64, i, q, 0, kind - 5)
        elif kind >= FLOAT_KINDS:  # F16 / BF16: value j of the block at vector j
            for j in range(32):
                dst[t, o + 32 * j + 2 * i] = src[r, s + 2 * j]
                dst[t, o + 32 * j + 2 * i + 1] = src[r, s + 2 * j + 1]
        else:
            _f16_copy(src, r, s + 208, dst, t, o, i)
            for half in range(2):  # llama.cpp dequantize_row_q6_K's order
                for l in range(32):
                    a = np.int32(src[r, s + 64 * half + l])
                    c = np.int32(src[r, s + 64 * half + 32 + l])
                    hb = np.int32(src[r, s + 128 + 32 * half + l])
                    y = 128 * half + l
                    q[y] = (a & 15) | ((hb & 3) << 4)
                    q[y + 32] = (c & 15) | (((hb >> 2) & 3) << 4)
                    q[y + 64] = (a >> 4) | (((hb >> 4) & 3) << 4)
                    q[y + 96] = (c >> 4) | (((hb >> 6) & 3) << 4)
            for j in range(8):
                tb = o + 32 + j * 416
                dst[t, tb + i] = src[r, s + 192 + 2 * j]  # scale of values 32j .. 32j + 15
                dst[t, tb + 16 + i] = src[r, s + 193 + 2 * j]
                _put_values(dst, t, tb + 32, i, q, 32 * j, 2)


@njit(cache=True, nogil=True)
def repack_tiles(kind, src, dst):  # type: ignore[no-untyped-def]
    """GGUF rows src [rows, n_super * GGUF bytes] -> tiles dst (tiled_shape); padding rows zero.
    Serial (Gemma's 178 MB head: ~0.15 s): a parallel build costs seconds of first-run compile."""
    rows = src.shape[0]
    nsb = src.shape[1] // GGUF_BYTES[kind]
    if (nsb * GGUF_BYTES[kind] != src.shape[1] or dst.shape[0] != (rows + TILE - 1) // TILE
            or dst.shape[1] != nsb * SB_BYTES[kind]):
        raise ValueError("repack_tiles: source and destination shapes do not match")
    for t in range(dst.shape[0]):
        dst[t, :] = 0
        q = np.empty(256, np.int32)
        for i in range(min(TILE, rows - t * TILE)):
            _repack_row(kind, src, t * TILE + i, dst, t, i, q)
