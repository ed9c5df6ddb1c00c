"""Q5_0 kept resident: 16-row tiles by default, or (FAK_TILES=0) Q8_0 blocks of the same values."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

from engine.kernels.blockdot import gemm
from engine.model.resident import resident_nbytes, resident_weight
from engine.quant import rows as K


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


@pytest.mark.parametrize("repack,layout", [("1", "Q8_0"), ("0", "Q5_0")])
def test_gguf_block_q5_0_matches_the_q5_0_kernel_bit_for_bit(monkeypatch: pytest.MonkeyPatch, repack: str,
                                                            layout: str) -> None:
    """FAK_TILES=0 (the A/B switch) keeps GGUF blocks: Q5_0 as Q8_0 blocks, or as itself."""
    monkeypatch.setenv("FAK_Q5_0_REPACK", repack)
    monkeypatch.setenv("FAK_TILES", "0")
    raw = _q5(33, 320, 2)
    w = resident_weight("t.q5", QT.Q5_0, raw, (33, 320))
    assert w.type_name == "Q5_0" and w.layout == layout
    assert w.nbytes == resident_nbytes("Q5_0", 33, 320)
    x = np.random.default_rng(3).standard_normal((4, 320)).astype(np.float32)
    direct = np.empty((4, 33), np.float32)
    gemm(raw, x, direct, K.F16_LUT, K.KIND["Q5_0"])
    assert np.array_equal(w.matmul(x), direct)
    assert np.array_equal(w.take([5, 0]), dequantize(raw, QT.Q5_0)[[5, 0]])


def test_q5_0_default_is_its_own_tiles() -> None:
    """By default Q5_0 stays 5-bit, in 16-row tiles: 22 bytes per row and block as in the GGUF."""
    raw = _q5(33, 320, 4)
    w = resident_weight("t.q5", QT.Q5_0, raw, (33, 320))
    assert w.layout == "Q5_0x16" and w.nbytes == 48 * 10 * 22
    x = np.random.default_rng(5).standard_normal((3, 320)).astype(np.float32)
    ref = x.astype(np.float64) @ dequantize(raw, QT.Q5_0).astype(np.float64).T
    assert np.abs(w.matmul(x) - ref).max() <= 1e-4 * np.abs(ref).max()  # int16 activations: ~2e-5 relative
    assert np.array_equal(w.take([32, 5, 0]), dequantize(raw, QT.Q5_0)[[32, 5, 0]])
    assert np.array_equal(w.dequantize(), dequantize(raw, QT.Q5_0))
