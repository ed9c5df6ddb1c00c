"""The codebook block formats (llama.cpp's i-quants: IQ1_S .. IQ4_XS) -> float32, vectorized numpy.

Layouts follow ggml-quants.c (dequantize_row_iq*). The grids (the codebooks of 4 or 8 values an
index selects) are ggml's tables as gguf-py ships them (`gguf.quants.<TYPE>.grid_hex`, each value
packed in 2 or 3 bits and mapped through `grid_map`); decoding them and the blocks is ours, and
tests/engine/quant/test_quant_dequant.py checks every type bit for bit against gguf.quants.dequantize.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np
from gguf import quants as gq
from gguf.constants import GGMLQuantizationType as QT

F32 = np.float32
IQ1_DELTA = F32(0.125)
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(F32)


@cache
def grid(name: str) -> np.ndarray:
    """ggml's codebook for type `name` as float32 [entries, values per entry]."""
    cls = getattr(gq, name)
    hexd = np.frombuffer(cls.grid_hex, np.uint8).reshape(-1, 2)
    nib = np.where(hexd > 0x40, hexd + 9, hexd) & 0x0F  # ASCII hex digit -> its value
    packed = (nib[:, 0] << 4) | nib[:, 1]
    bits = int(np.ceil(np.log2(len(cls.grid_map))))
    step = 8 // (8 // bits)  # 3-bit codes sit two to a byte, at bits 0 and 4
    codes = (packed[:, None] >> np.arange(0, 8, step, dtype=np.uint8)[None, :]) & ((1 << bits) - 1)
    return np.array(cls.grid_map, F32)[codes.reshape(-1)].reshape(cls.grid_shape)


def _ksigns() -> np.ndarray:
    """The 128 sign patterns of 8 values with an even count of minus signs (bit 7 = parity of 0..6)."""
    k = np.arange(128, dtype=np.uint8)
    parity = np.unpackbits(k[:, None], axis=1).sum(axis=1).astype(np.uint8) & 1
    return k | (parity << 7)


KSIGNS = _ksigns()


def _signs(bits: np.ndarray) -> np.ndarray:
    """Sign bytes [...] -> float32 +-1 [..., 8] (bit j set: value j negative)."""
    return np.where((bits[..., None] >> np.arange(8, dtype=np.uint8)) & 1, F32(-1), F32(1))


def _iq2_xxs(blk: np.ndarray) -> np.ndarray:
    """66 bytes / 256: f16 d, then per 32 values two u32: 4 grid indices (bytes), and 4 x 7-bit sign
    indices + a 4-bit scale. Value = d * (0.5 + s) / 4 * grid * sign."""
    n = blk.shape[0]
    d = _f16(blk[:, 0:2])
    q = np.ascontiguousarray(blk[:, 2:66]).view(np.uint32).reshape(n, 8, 2)
    db = (d[:, None] * (F32(0.5) + (q[:, :, 1] >> 28).astype(F32)) * F32(0.25)).reshape(n, 8, 1, 1)
    sidx = (q[:, :, 1:2] >> np.array([0, 7, 14, 21], np.uint32)) & 0x7F
    g = grid("IQ2_XXS")[np.ascontiguousarray(q[:, :, 0]).view(np.uint8).reshape(n, 8, 4)]
    return (db * g * _signs(KSIGNS[sidx])).reshape(n, 256)


def _iq2_xs(blk: np.ndarray) -> np.ndarray:
    """74 bytes / 256: f16 d, 32 u16 (9-bit grid index, 7-bit sign index), 8 bytes of 4-bit scales
    (one per 16 values)."""
    n = blk.shape[0]
    d = _f16(blk[:, 0:2])
    q = np.ascontiguousarray(blk[:, 2:66]).view(np.uint16).reshape(n, 16, 2)
    s = np.stack([blk[:, 66:74] & 0x0F, blk[:, 66:74] >> 4], axis=2).reshape(n, 16)
    db = (d[:, None] * (F32(0.5) + s.astype(F32)) * F32(0.25)).reshape(n, 16, 1, 1)
    return (db * grid("IQ2_XS")[q & 511] * _signs(KSIGNS[q >> 9])).reshape(n, 256)


def _iq2_s(blk: np.ndarray) -> np.ndarray:
    """82 bytes / 256: f16 d, 32 low index bytes, 32 sign bytes, 8 bytes of index high bits (2 each),
    8 bytes of 4-bit scales (one per 16 values)."""
    n = blk.shape[0]
    d = _f16(blk[:, 0:2])
    hi = (blk[:, 66:74, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3
    idx = (blk[:, 2:34].astype(np.uint16) | (hi.reshape(n, 32).astype(np.uint16) << 8)).reshape(n, 16, 2)
    s = np.stack([blk[:, 74:82] & 0x0F, blk[:, 74:82] >> 4], axis=2).reshape(n, 16)
    db = (d[:, None] * (F32(0.5) + s.astype(F32)) * F32(0.25)).reshape(n, 16, 1, 1)
    return (db * grid("IQ2_S")[idx] * _signs(blk[:, 34:66].reshape(n, 16, 2))).reshape(n, 256)


def _iq3_xxs(blk: np.ndarray) -> np.ndarray:
    """98 bytes / 256: f16 d, 64 grid indices (4 values each), then per 32 values a u32 of 4 x 7-bit
    sign indices + a 4-bit scale. Value = d * (0.5 + s) / 2 * grid * sign."""
    n = blk.shape[0]
    d = _f16(blk[:, 0:2])
    aux = np.ascontiguousarray(blk[:, 66:98]).view(np.uint32)  # [n, 8]
    db = (d[:, None] * (F32(0.5) + (aux >> 28).astype(F32)) * F32(0.5)).reshape(n, 8, 1, 1)
    sidx = (aux[:, :, None] >> np.array([0, 7, 14, 21], np.uint32)) & 0x7F
    g = grid("IQ3_XXS")[blk[:, 2:66]].reshape(n, 8, 4, 8)
    return (db * g * _signs(KSIGNS[sidx])).reshape(n, 256)


def _iq3_s(blk: np.ndarray) -> np.ndarray:
    """110 bytes / 256: f16 d, 64 low index bytes, 8 bytes of index 9th bits, 32 sign bytes, 4 bytes
    of 4-bit scales (one per 32 values). Value = d * (1 + 2 s) * grid * sign."""
    n = blk.shape[0]
    d = _f16(blk[:, 0:2])
    hb = ((blk[:, 66:74, None] >> np.arange(8, dtype=np.uint8)) & 1).reshape(n, 64).astype(np.uint16)
    idx = blk[:, 2:66].astype(np.uint16) | (hb << 8)
    s = np.stack([blk[:, 106:110] & 0x0F, blk[:, 106:110] >> 4], axis=2).reshape(n, 8)
    db = (d[:, None] * (1 + 2 * s)).reshape(n, 8, 1, 1)
    g = grid("IQ3_S")[idx].reshape(n, 8, 4, 8)
    return (db * g * _signs(blk[:, 74:106].reshape(n, 8, 4))).reshape(n, 256)


def _iq1_s(blk: np.ndarray) -> np.ndarray:
    """50 bytes / 256: f16 d, 32 low index bytes, 8 u16 (per 32 values: 4 x 3 index high bits, a
    3-bit scale, the delta's sign). Value = d * (2 s + 1) * (grid + delta), grid in {-1, 0, 1}."""
    n = blk.shape[0]
    d = _f16(blk[:, 0:2])
    qh = np.ascontiguousarray(blk[:, 34:50]).view(np.uint16)  # [n, 8]
    dl = (d[:, None] * (2 * ((qh >> 12) & 7) + 1)).reshape(n, 8, 1, 1)
    delta = np.where((qh & 0x8000) == 0, IQ1_DELTA, -IQ1_DELTA).reshape(n, 8, 1, 1)
    hi = (qh[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & 7
    idx = blk[:, 2:34].astype(np.uint16).reshape(n, 8, 4) | (hi << 8)
    return (dl * (grid("IQ1_S")[idx] + delta)).reshape(n, 256)


def _iq1_m(blk: np.ndarray) -> np.ndarray:
    """56 bytes / 256: 32 low index bytes, 16 bytes (per 8 values a nibble: 3 index high bits, the
    delta's sign), 4 u16 holding 3-bit scales (one per 16 values) and, in their top nibbles, f16 d."""
    n = blk.shape[0]
    sc = np.ascontiguousarray(blk[:, 48:56]).view(np.uint16)  # [n, 4]
    dbits = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00) | (sc[:, 3] & 0xF000)
    d = dbits.astype(np.uint16).view(np.float16).astype(F32)
    s = ((sc[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & 7).reshape(n, 16)
    dl = (d[:, None] * (2 * s + 1)).reshape(n, 8, 2, 1, 1)
    qh = np.stack([blk[:, 32:48] & 0x0F, blk[:, 32:48] >> 4], axis=2).reshape(n, 32)
    idx = blk[:, 0:32].astype(np.uint16) | ((qh & 7).astype(np.uint16) << 8)
    delta = np.where((qh & 8) == 0, IQ1_DELTA, -IQ1_DELTA).reshape(n, 8, 2, 2, 1)
    return (dl * (grid("IQ1_M")[idx].reshape(n, 8, 2, 2, 8) + delta)).reshape(n, 256)


def _iq4_nl(blk: np.ndarray) -> np.ndarray:
    """18 bytes / 32: f16 d, 16 bytes of nibbles (low: values 0..15) indexing a fixed non-linear table."""
    d = _f16(blk[:, 0:2])
    q = np.concatenate([blk[:, 2:18] & 0x0F, blk[:, 2:18] >> 4], axis=1)
    return d[:, None] * IQ4_VALUES[q].astype(F32)


def _iq4_xs(blk: np.ndarray) -> np.ndarray:
    """136 bytes / 256: f16 d, u16 of scale high bits (2 per 32 values), 4 bytes of scale low nibbles,
    128 bytes of nibbles (per 32 values: 16 bytes, low nibbles first). Value = d * (s - 32) * table[q]."""
    n = blk.shape[0]
    d = _f16(blk[:, 0:2])
    sh = np.ascontiguousarray(blk[:, 2:4]).view(np.uint16)  # [n, 1]
    sl = np.stack([blk[:, 4:8] & 0x0F, blk[:, 4:8] >> 4], axis=2).reshape(n, 8)
    shi = ((sh >> np.arange(0, 16, 2, dtype=np.uint16)) & 3).astype(np.uint8)
    dl = (d[:, None] * ((sl | (shi << 4)).astype(np.int8) - np.int8(32)).astype(F32))[:, :, None]
    qs = blk[:, 8:136].reshape(n, 8, 16)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2)
    return (dl * IQ4_VALUES[q].astype(F32)).reshape(n, 256)


IQ_BLOCK: dict[QT, Callable[[np.ndarray], np.ndarray]] = {
    QT.IQ2_XXS: _iq2_xxs, QT.IQ2_XS: _iq2_xs, QT.IQ2_S: _iq2_s, QT.IQ3_XXS: _iq3_xxs, QT.IQ3_S: _iq3_s,
    QT.IQ1_S: _iq1_s, QT.IQ1_M: _iq1_m, QT.IQ4_NL: _iq4_nl, QT.IQ4_XS: _iq4_xs,
}
