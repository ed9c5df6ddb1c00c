"""Block types kept resident as a wider type of exactly the same values (no kernel of their own).

- Q3_K -> Q6_K: value d * scale * q with an int8 scale per 16 values and q in -4..3: Q6_K holds the
  same f16 d, the same int8 scales and q + 32 in its 6 bits, so every value (and the product
  d * scale * q the kernels form) is the same float32. 210 bytes per 256 values instead of 110.
- IQ4_NL -> Q8_0: value d * table[nibble], the table int8: Q8_0 holds d and the table values.
  34 bytes per 32 values instead of 18.

`WIDEN[qtype] = (resident type, repack)`: numba loops, ~1 GB/s on one core (numpy's vectorized
passes: 43 MB/s); tests/engine/model/test_resident_types.py checks the widened blocks of random bytes dequantize
(gguf-py's dequantizer) to the source's values bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf.constants import GGMLQuantizationType as QT
from numba import njit

from engine.quant.iquant import IQ4_VALUES


@njit(cache=True, nogil=True)
def _q3_k_to_q6_k(src, dst):  # type: ignore[no-untyped-def]
    """Q3_K blocks [n, 110] -> Q6_K blocks [n, 210], block by block (numba: ~30x numpy's passes)."""
    L = np.empty(256, np.int32)
    for b in range(src.shape[0]):
        for m in range(16):  # 6-bit scales: low nibbles in bytes 0..7, high pairs in bytes 8..11
            lo = (np.int32(src[b, 96 + m % 8]) >> (4 * (m // 8))) & 15
            hi = (np.int32(src[b, 104 + m % 4]) >> (2 * (m // 4))) & 3
            dst[b, 192 + m] = np.uint8(((lo | (hi << 4)) - 32) & 255)
        for h in range(2):
            for s in range(4):
                for l in range(32):
                    q2 = (np.int32(src[b, 32 + 32 * h + l]) >> (2 * s)) & 3
                    hb = (np.int32(src[b, l]) >> (4 * h + s)) & 1  # hmask bit j of byte l: value 32 j + l
                    L[128 * h + 32 * s + l] = q2 - 4 * (1 - hb) + 32
        for h in range(2):
            for l in range(32):
                e = 128 * h + l
                dst[b, 64 * h + l] = np.uint8((L[e] & 15) | ((L[e + 64] & 15) << 4))
                dst[b, 64 * h + 32 + l] = np.uint8((L[e + 32] & 15) | ((L[e + 96] & 15) << 4))
                dst[b, 128 + 32 * h + l] = np.uint8((L[e] >> 4) | ((L[e + 32] >> 4) << 2) | ((L[e + 64] >> 4) << 4)
                                                    | ((L[e + 96] >> 4) << 6))
        dst[b, 208] = src[b, 108]
        dst[b, 209] = src[b, 109]


@njit(cache=True, nogil=True)
def _iq4_nl_to_q8_0(src, dst, table):  # type: ignore[no-untyped-def]
    """IQ4_NL blocks [n, 18] -> Q8_0 blocks [n, 34]: the same d, the table's int8 values."""
    for b in range(src.shape[0]):
        dst[b, 0] = src[b, 0]
        dst[b, 1] = src[b, 1]
        for j in range(16):
            v = src[b, 2 + j]
            dst[b, 2 + j] = table[v & 15]
            dst[b, 18 + j] = table[v >> 4]


def q3_k_as_q6_k(raw: np.ndarray) -> np.ndarray:
    """Q3_K rows uint8 [rows, nsb * 110] -> Q6_K rows [rows, nsb * 210] of the same values."""
    src = np.ascontiguousarray(raw).reshape(-1, 110)
    out = np.empty((src.shape[0], 210), np.uint8)
    _q3_k_to_q6_k(src, out)
    return out.reshape(raw.shape[0], -1)


def iq4_nl_as_q8_0(raw: np.ndarray) -> np.ndarray:
    """IQ4_NL rows uint8 [rows, nb * 18] -> Q8_0 rows [rows, nb * 34] of the same values."""
    src = np.ascontiguousarray(raw).reshape(-1, 18)
    out = np.empty((src.shape[0], 34), np.uint8)
    _iq4_nl_to_q8_0(src, out, IQ4_VALUES.view(np.uint8))
    return out.reshape(raw.shape[0], -1)


WIDEN: dict[QT, tuple[QT, Callable[[np.ndarray], np.ndarray]]] = {
    QT.Q3_K: (QT.Q6_K, q3_k_as_q6_k),
    QT.IQ4_NL: (QT.Q8_0, iq4_nl_as_q8_0),
}
