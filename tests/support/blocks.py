"""Random quantized blocks for kernel tests: from a random matrix (random_blocks) or random bytes with sane
scales (random_raw_blocks)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import quantize

from engine.quant.quantize import quantize_q4_k, quantize_q5_k, quantize_q8_0

F16_FIELDS = {
    QT.Q4_0: (0,), QT.Q5_0: (0,), QT.Q8_0: (0,), QT.Q4_1: (0, 2), QT.Q5_1: (0, 2), QT.Q4_K: (0, 2),
    QT.Q5_K: (0, 2), QT.Q6_K: (208,), QT.Q2_K: (80, 82), QT.Q3_K: (108,), QT.TQ1_0: (52,), QT.TQ2_0: (64,),
    QT.IQ2_XXS: (0,), QT.IQ2_XS: (0,), QT.IQ2_S: (0,), QT.IQ3_XXS: (0,), QT.IQ3_S: (0,), QT.IQ1_S: (0,),
    QT.IQ4_NL: (0,), QT.IQ4_XS: (0,),
}

TYPES = [QT.Q8_0, QT.Q5_0, QT.Q4_K, QT.Q6_K]


def random_blocks(qtype: QT, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """uint8 [rows, row_bytes] blocks of `qtype` for a random float matrix (any shape)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * rng.uniform(0.2, 2.0, (rows, 1))).astype(np.float32)
    if qtype == QT.Q8_0:
        return quantize_q8_0(x)
    if qtype == QT.Q4_K:
        return quantize_q4_k(x)
    if qtype in (QT.Q5_0, QT.Q4_0, QT.Q4_1, QT.Q5_1, QT.BF16):
        return quantize(x, qtype)
    if qtype == QT.Q5_K:
        return quantize_q5_k(x)
    if qtype == QT.F16:
        return x.astype(np.float16).view(np.uint8)
    # Q6_K has no quantizer here: random quant bits, int8 sub-scales, a sane f16 d per super-block.
    nsb = cols // 256
    b = rng.integers(0, 256, (rows, nsb, 210), dtype=np.uint8)
    b[:, :, 192:208] = rng.integers(-60, 61, (rows, nsb, 16)).astype(np.int8).view(np.uint8)
    b[:, :, 208:210] = rng.uniform(1e-3, 2e-2, (rows, nsb)).astype(np.float16).view(np.uint8).reshape(rows, nsb, 2)
    return b.reshape(rows, nsb * 210)


def random_raw_blocks(qtype: QT, n_blocks: int, seed: int) -> np.ndarray:
    """Random bytes with sane f16 scales (random bits may be inf/nan, which compare badly)."""
    rng = np.random.default_rng(seed)
    _, ts = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)

    def f16(lo: float = -2, hi: float = 2) -> np.ndarray:
        return rng.uniform(lo, hi, n_blocks).astype(np.float16).view(np.uint16)

    for col in F16_FIELDS.get(qtype, ()):
        raw[:, col: col + 2] = f16().view(np.uint8).reshape(-1, 2)
    if qtype == QT.Q8_K:
        raw[:, 0:4] = rng.uniform(-2, 2, n_blocks).astype(np.float32).view(np.uint8).reshape(-1, 4)
    elif qtype == QT.MXFP4:  # e8m0 exponents, 0 and 1 (the subnormal halves) included
        raw[:, 0] = rng.integers(0, 150, n_blocks)
        raw[:2, 0] = (0, 1)
    elif qtype == QT.IQ1_M:  # f16 d split over the top nibbles of the four scale u16s
        sc = raw[:, 48:56].copy().view(np.uint16) & 0x0FFF
        d = f16()[:, None]
        sc |= ((d >> np.array([0, 4, 8, 12], np.uint16)) & 0xF) << 12
        raw[:, 48:56] = sc.view(np.uint8)
    return raw
