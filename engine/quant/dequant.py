"""GGML block formats -> float32, vectorized numpy (one pass over whole block arrays, in chunks).

Layouts follow ggml-quants.c (dequantize_row_*). `gguf.quants.dequantize` is the reference in tests.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as QT

from engine.errors import GGUFError
from engine.quant.iquant import IQ_BLOCK

QK_K = 256
_CHUNK_BLOCKS = 1 << 14  # bounds temporaries and keeps the working set cache-sized


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian f16 bytes [..., 2] -> f32 [...]."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _q8_0(blk: np.ndarray) -> np.ndarray:
    d = _f16(blk[:, 0:2])
    return d[:, None] * blk[:, 2:34].view(np.int8).astype(np.float32)


def _q4_0(blk: np.ndarray) -> np.ndarray:
    d = _f16(blk[:, 0:2])
    qs = blk[:, 2:18]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int8) - np.int8(8)
    return d[:, None] * q.astype(np.float32)


def _q4_1(blk: np.ndarray) -> np.ndarray:
    d, m = _f16(blk[:, 0:2]), _f16(blk[:, 2:4])
    qs = blk[:, 4:20]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
    return d[:, None] * q + m[:, None]


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """4 bytes of a little-endian u32 -> its 32 bits [n, 32] as uint8 (bit j at index j)."""
    return np.unpackbits(np.ascontiguousarray(qh), axis=1, bitorder="little")


def _q5_0(blk: np.ndarray) -> np.ndarray:
    d = _f16(blk[:, 0:2])
    hb = _high_bits(blk[:, 2:6]) << 4
    qs = blk[:, 6:22]
    q = (np.concatenate([qs & 0x0F, qs >> 4], axis=1) | hb).astype(np.int8) - np.int8(16)
    return d[:, None] * q.astype(np.float32)


def _q5_1(blk: np.ndarray) -> np.ndarray:
    d, m = _f16(blk[:, 0:2]), _f16(blk[:, 2:4])
    hb = _high_bits(blk[:, 4:8]) << 4
    qs = blk[:, 8:24]
    q = (np.concatenate([qs & 0x0F, qs >> 4], axis=1) | hb).astype(np.float32)
    return d[:, None] * q + m[:, None]


def _k_scales(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 packed scale bytes of Q4_K/Q5_K -> 8 six-bit scales and 8 six-bit mins (get_scale_min_k4)."""
    s = np.empty((sc.shape[0], 8), dtype=np.uint8)
    m = np.empty((sc.shape[0], 8), dtype=np.uint8)
    s[:, :4] = sc[:, 0:4] & 63
    m[:, :4] = sc[:, 4:8] & 63
    s[:, 4:] = (sc[:, 8:12] & 0x0F) | ((sc[:, 0:4] >> 6) << 4)
    m[:, 4:] = (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)
    return s.astype(np.float32), m.astype(np.float32)


def _nibbles_k(qs: np.ndarray) -> np.ndarray:
    """128 bytes -> 256 4-bit values in K-quant order: per 32-byte group, low nibbles then high nibbles."""
    g = qs.reshape(-1, 4, 32)
    return np.stack([g & 0x0F, g >> 4], axis=2).reshape(-1, 8, 32)


def _q4_k(blk: np.ndarray) -> np.ndarray:
    d, dmin = _f16(blk[:, 0:2]), _f16(blk[:, 2:4])
    sc, mn = _k_scales(blk[:, 4:16])
    q = _nibbles_k(blk[:, 16:144]).astype(np.float32)
    y = (d[:, None] * sc)[:, :, None] * q - (dmin[:, None] * mn)[:, :, None]
    return y.reshape(-1, QK_K)


def _q5_k(blk: np.ndarray) -> np.ndarray:
    d, dmin = _f16(blk[:, 0:2]), _f16(blk[:, 2:4])
    sc, mn = _k_scales(blk[:, 4:16])
    qh = blk[:, 16:48]  # bit j of qh[l] is the 5th bit of element l of sub-block j
    hb = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    q = (_nibbles_k(blk[:, 48:176]) | (hb << 4)).astype(np.float32)
    y = (d[:, None] * sc)[:, :, None] * q - (dmin[:, None] * mn)[:, :, None]
    return y.reshape(-1, QK_K)


def _q6_k(blk: np.ndarray) -> np.ndarray:
    ql = blk[:, 0:128].reshape(-1, 2, 64)  # two halves of 128 elements
    qh = blk[:, 128:192].reshape(-1, 2, 32)
    sc = blk[:, 192:208].view(np.int8).astype(np.float32).reshape(-1, 16)
    d = _f16(blk[:, 208:210])
    lo = np.concatenate([ql[:, :, :32] & 0x0F, ql[:, :, 32:] & 0x0F, ql[:, :, :32] >> 4, ql[:, :, 32:] >> 4], axis=2)
    hi = np.concatenate([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=2)
    q = (lo | (hi << 4)).astype(np.int8) - np.int8(32)  # [n, 2, 128]
    y = q.astype(np.float32).reshape(-1, 16, 16) * (d[:, None] * sc)[:, :, None]
    return y.reshape(-1, QK_K)


def _q2_k(blk: np.ndarray) -> np.ndarray:
    """84 bytes / 256: 16 scale bytes (low nibble scale, high nibble min, per 16 values), 64 bytes of
    2-bit q (4 shifts of each 32-byte half), f16 d, f16 dmin. Value = d*sc*q - dmin*m."""
    sc = blk[:, 0:16]
    d, dmin = _f16(blk[:, 80:82]), _f16(blk[:, 82:84])
    dl = (d[:, None] * (sc & 0x0F).astype(np.float32))[:, :, None]
    ml = (dmin[:, None] * (sc >> 4).astype(np.float32))[:, :, None]
    q = (blk[:, 16:80].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]) & 3
    return (dl * q.reshape(-1, 16, 16).astype(np.float32) - ml).reshape(-1, QK_K)


def q3_k_parts(blk: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q3_K blocks [n, 110] -> (f16 d [n], int8 scales [n, 16] (one per 16 values), int8 q [n, 256] in
    -4..3). 110 bytes / 256: hmask[32] (bit j: the high bit of sub-row j), 2-bit qs[64], 12 bytes of
    6-bit scales (offset 32), f16 d. Value = d * scale * q."""
    hmask, qs, sc = blk[:, 0:32], blk[:, 32:96], blk[:, 96:108]
    d = np.ascontiguousarray(blk[:, 108:110]).view(np.float16)[:, 0]
    lo = (sc[:, 0:8, None] >> np.array([0, 4], np.uint8)[None, None, :]).transpose(0, 2, 1).reshape(-1, 16) & 0x0F
    hi = (sc[:, 8:12, None] >> np.array([0, 2, 4, 6], np.uint8)[None, None, :]).transpose(0, 2, 1).reshape(-1, 16) & 3
    scale = (lo | (hi << 4)).astype(np.int8) - np.int8(32)
    ql = (qs.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]) & 3
    qh = (hmask.reshape(-1, 1, 1, 32) >> np.arange(8, dtype=np.uint8)[None, None, :, None]) & 1
    q = ql.reshape(-1, QK_K).astype(np.int8) - ((qh.reshape(-1, QK_K) ^ 1) << 2).astype(np.int8)
    return d, scale, q


def _q3_k(blk: np.ndarray) -> np.ndarray:
    d, scale, q = q3_k_parts(blk)
    dl = (d.astype(np.float32)[:, None] * scale.astype(np.float32))[:, :, None]
    return (dl * q.reshape(-1, 16, 16).astype(np.float32)).reshape(-1, QK_K)


def _tq1_0(blk: np.ndarray) -> np.ndarray:
    """54 bytes / 256 ternary values: 48 bytes of 5 trits (base-3 digits as fixed-point fractions of
    a byte), 4 bytes of 4 trits, f16 d. A digit is (byte * 3^k mod 256) * 3 >> 8; value = d * (t - 1)."""
    d = _f16(blk[:, 52:54])
    p5 = np.array([1, 3, 9, 27, 81], np.uint8)[None, :, None]
    parts = [(blk[:, 0:32, None].transpose(0, 2, 1) * p5).reshape(-1, 160),
             (blk[:, 32:48, None].transpose(0, 2, 1) * p5).reshape(-1, 80),
             (blk[:, 48:52, None].transpose(0, 2, 1) * p5[:, :4]).reshape(-1, 16)]
    t = ((np.concatenate(parts, axis=1).astype(np.uint16) * 3) >> 8).astype(np.int8) - np.int8(1)
    return d[:, None] * t.astype(np.float32)


def _tq2_0(blk: np.ndarray) -> np.ndarray:
    """66 bytes / 256 ternary values: 2-bit codes (4 shifts per 32-byte half), f16 d; value = d * (q - 1)."""
    d = _f16(blk[:, 64:66])
    q = (blk[:, 0:64].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]) & 3
    return d[:, None] * (q.reshape(-1, QK_K).astype(np.int8) - np.int8(1)).astype(np.float32)


_E2M1_X2 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)  # FP4 e2m1 values, doubled


def _mxfp4(blk: np.ndarray) -> np.ndarray:
    """17 bytes / 32: an e8m0 exponent (decoded as half the power of two, ggml_e8m0_to_fp32_half),
    16 bytes of e2m1 nibbles (low: values 0..15)."""
    e = blk[:, 0:1].astype(np.uint32)
    d = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23)).astype(np.uint32).view(np.float32)
    q = np.concatenate([blk[:, 1:17] & 0x0F, blk[:, 1:17] >> 4], axis=1)
    return d * _E2M1_X2[q].astype(np.float32)


def _ue4m3_half(x: np.ndarray) -> np.ndarray:
    """Unsigned e4m3 (bias 7) scale bytes -> float32, halved for the doubled e2m1 values (0x7F: 0)."""
    exp = x.astype(np.int32) >> 3 & 0xF
    man = (x & 7).astype(np.float32)
    raw = np.where(exp == 0, man * np.float32(2.0**-9),
                   (np.float32(1) + man / np.float32(8)) * (np.float32(2) ** (exp.astype(np.float32) - np.float32(7))))
    return np.where((x == 0) | (x == 0x7F), np.float32(0), raw * np.float32(0.5)).astype(np.float32)


def _nvfp4(blk: np.ndarray) -> np.ndarray:
    """36 bytes / 64: 4 ue4m3 scales (one per 16 values), 4 x 8 bytes of e2m1 nibbles (low nibbles:
    values 0..7 of the 16, high: 8..15)."""
    d = _ue4m3_half(blk[:, 0:4])[:, :, None]
    qs = blk[:, 4:36].reshape(-1, 4, 8)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2)
    return (d * _E2M1_X2[q].astype(np.float32)).reshape(-1, 64)


def _q8_k(blk: np.ndarray) -> np.ndarray:
    d = np.ascontiguousarray(blk[:, 0:4]).view(np.float32)[:, 0]
    return d[:, None] * blk[:, 4:260].view(np.int8).astype(np.float32)


_BLOCK: dict[QT, Callable[[np.ndarray], np.ndarray]] = {
    QT.Q4_0: _q4_0, QT.Q4_1: _q4_1, QT.Q5_0: _q5_0, QT.Q5_1: _q5_1, QT.Q8_0: _q8_0,
    QT.Q4_K: _q4_k, QT.Q5_K: _q5_k, QT.Q6_K: _q6_k, QT.Q8_K: _q8_k, QT.Q2_K: _q2_k, QT.Q3_K: _q3_k,
    QT.TQ1_0: _tq1_0, QT.TQ2_0: _tq2_0, QT.MXFP4: _mxfp4, QT.NVFP4: _nvfp4, **IQ_BLOCK,
}
SUPPORTED = (QT.F32, QT.F16, QT.BF16, *_BLOCK)


def dequantize(raw: np.ndarray, qtype: QT, n_elements: int) -> np.ndarray:
    """Raw tensor bytes (uint8, any shape) -> flat float32 [n_elements]."""
    qtype = QT(qtype)
    buf = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if qtype == QT.F32:
        return buf.view(np.float32)[:n_elements].copy()
    if qtype == QT.F16:
        return buf.view(np.float16)[:n_elements].astype(np.float32)
    if qtype == QT.BF16:
        return (buf.view(np.uint16)[:n_elements].astype(np.uint32) << 16).view(np.float32)
    fn = _BLOCK.get(qtype)
    if fn is None:
        raise GGUFError(f"unsupported tensor type {qtype.name}")
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n_blocks = n_elements // block_size
    blocks = buf[: n_blocks * type_size].reshape(n_blocks, type_size)
    out = np.empty((n_blocks, block_size), dtype=np.float32)
    for i in range(0, n_blocks, _CHUNK_BLOCKS):
        out[i : i + _CHUNK_BLOCKS] = fn(blocks[i : i + _CHUNK_BLOCKS])
    return out.reshape(-1)


def tensor_nbytes(qtype: QT, n_elements: int) -> int:
    block_size, type_size = GGML_QUANT_SIZES[QT(qtype)]
    return n_elements // block_size * type_size
