"""Q5_0 kept resident as Q8_0 blocks (tiled by default): the same values, so the same results."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

from engine import kernels as K
from engine import tiledot as T
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


@pytest.mark.parametrize("repack,tiles,layout", [("1", "0", "Q8_0"), ("0", "1", "Q5_0")])
def test_resident_q5_0_matches_the_q5_0_kernel_bit_for_bit(monkeypatch: pytest.MonkeyPatch, repack: str, tiles: str,
                                                          layout: str) -> None:
    monkeypatch.setenv("FAK_Q5_0_REPACK", repack)
    monkeypatch.setenv("FAK_Q8_0_TILES", tiles)
    raw = _q5(33, 320, 2)
    w = resident_weight("t.q5", QT.Q5_0, raw, (33, 320))
    assert w.type_name == "Q5_0" and w.layout == layout
    x = np.random.default_rng(3).standard_normal((4, 320)).astype(np.float32)
    direct = np.empty((4, 33), np.float32)
    K.gemm(raw, x, direct, K.F16_LUT, K.KIND["Q5_0"])
    assert np.array_equal(w.matmul(x), direct)
    assert np.array_equal(w.take([5, 0]), dequantize(raw, QT.Q5_0)[[5, 0]])


def test_resident_q5_0_default_is_the_tiled_q8_0_of_the_same_values() -> None:
    """By default Q5_0 goes Q5_0 -> Q8_0 blocks -> 16-row tiles: the tile kernel on the same values."""
    raw = _q5(33, 320, 4)
    w = resident_weight("t.q5", QT.Q5_0, raw, (33, 320))
    assert w.layout == "Q8_0x16"
    q8 = np.empty((33, 10 * 34), np.uint8)
    K.repack_q5_0_q8_0(raw, q8)
    tiles = np.empty((3, 10 * T.TILE_BLOCK), np.uint8)
    T.repack_q8_0_tiles(q8, tiles)
    x = np.random.default_rng(5).standard_normal((3, 320)).astype(np.float32)
    want = np.empty((3, 33), np.float32)
    T.gemm_tiles(tiles, x, want)
    assert np.array_equal(w.matmul(x), want)
    ref = x.astype(np.float64) @ dequantize(raw, QT.Q5_0).astype(np.float64).T
    assert np.abs(w.matmul(x) - ref).max() <= 1e-4 * np.abs(ref).max()  # int16 activations: ~2e-5 relative
    assert np.array_equal(w.take([32, 5, 0]), dequantize(raw, QT.Q5_0)[[32, 5, 0]])
    assert np.array_equal(w.dequantize(), dequantize(raw, QT.Q5_0))
