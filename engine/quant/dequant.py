"""GGML block formats -> float32, vectorized numpy (one pass over whole block arrays, in chunks).

Layouts follow ggml-quants.c (dequantize_row_*). `gguf.quants.dequantize` is the reference in tests.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT

from engine.errors import GGUFError

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


def _q8_k(blk: np.ndarray) -> np.ndarray:
    d = np.ascontiguousarray(blk[:, 0:4]).view(np.float32)[:, 0]
    return d[:, None] * blk[:, 4:260].view(np.int8).astype(np.float32)


_BLOCK: dict[QT, Callable[[np.ndarray], np.ndarray]] = {
    QT.Q4_0: _q4_0, QT.Q4_1: _q4_1, QT.Q5_0: _q5_0, QT.Q5_1: _q5_1, QT.Q8_0: _q8_0,
    QT.Q4_K: _q4_k, QT.Q5_K: _q5_k, QT.Q6_K: _q6_k, QT.Q8_K: _q8_k,
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
