"""Q5_0 kept resident as Q8_0 blocks: the same values, so the same results bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

from engine import kernels as K
from engine.resident import resident_weight


def _q5(rows: int, cols: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    return quantize(x, QT.Q5_0)


def test_repacked_blocks_dequantize_to_the_same_values() -> None:
    raw = _q5(9, 256, 1)
    out = np.empty((9, 8 * 34), np.uint8)
    K.repack_q5_0_q8_0(raw, out)
    assert np.array_equal(dequantize(out, QT.Q8_0), dequantize(raw, QT.Q5_0))
    q = out.reshape(9, 8, 34)[:, :, 2:].view(np.int8)
    assert q.min() >= -16 and q.max() <= 15  # 5-bit values


@pytest.mark.parametrize("repack", ["1", "0"])
def test_resident_q5_0_matches_the_q5_0_kernel_bit_for_bit(monkeypatch: pytest.MonkeyPatch, repack: str) -> None:
    monkeypatch.setenv("FAK_Q5_0_REPACK", repack)
    raw = _q5(33, 320, 2)
    w = resident_weight("t.q5", QT.Q5_0, raw, (33, 320))
    assert w.type_name == "Q5_0" and w.layout == ("Q8_0" if repack == "1" else "Q5_0")
    x = np.random.default_rng(3).standard_normal((4, 320)).astype(np.float32)
    direct = np.empty((4, 33), np.float32)
    K.gemm(raw, x, direct, K.F16_LUT, K.KIND["Q5_0"])
    assert np.array_equal(w.matmul(x), direct)
    assert np.array_equal(w.take([5, 0]), dequantize(raw, QT.Q5_0)[[5, 0]])
