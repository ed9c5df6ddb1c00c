"""Block types kept resident as a wider type of exactly the same values (no kernel of their own).

- Q3_K -> Q6_K: value d * scale * q with an int8 scale per 16 values and q in -4..3: Q6_K holds the
  same f16 d, the same int8 scales and q + 32 in its 6 bits, so every value (and the product
  d * scale * q the kernels form) is the same float32. 210 bytes per 256 values instead of 110.
- IQ4_NL -> Q8_0: value d * table[nibble], the table int8: Q8_0 holds d and the table values.
  34 bytes per 32 values instead of 18.

`WIDEN[qtype] = (resident type, repack)`; tests/test_resident_types.py checks the widened blocks
dequantize (gguf-py's dequantizer) to the source's values bit for bit.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from gguf.constants import GGMLQuantizationType as QT

from engine.quant.dequant import q3_k_parts
from engine.quant.iquant import IQ4_VALUES
from engine.quant.quantize import pack_q6_k


def q3_k_as_q6_k(raw: np.ndarray) -> np.ndarray:
    """Q3_K rows uint8 [rows, nsb * 110] -> Q6_K rows [rows, nsb * 210] of the same values."""
    rows = raw.shape[0]
    d, sc, q = q3_k_parts(np.ascontiguousarray(raw).reshape(-1, 110))
    return pack_q6_k(q, sc, d).reshape(rows, -1)


def iq4_nl_as_q8_0(raw: np.ndarray) -> np.ndarray:
    """IQ4_NL rows uint8 [rows, nb * 18] -> Q8_0 rows [rows, nb * 34] of the same values."""
    rows = raw.shape[0]
    blk = np.ascontiguousarray(raw).reshape(-1, 18)
    q = np.concatenate([blk[:, 2:18] & 0x0F, blk[:, 2:18] >> 4], axis=1)
    return np.concatenate([blk[:, 0:2], IQ4_VALUES[q].view(np.uint8)], axis=1).reshape(rows, -1)


WIDEN: dict[QT, tuple[QT, Callable[[np.ndarray], np.ndarray]]] = {
    QT.Q3_K: (QT.Q6_K, q3_k_as_q6_k),
    QT.IQ4_NL: (QT.Q8_0, iq4_nl_as_q8_0),
}
