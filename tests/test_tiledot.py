"""Q8_0 weights in 16-row tiles x int16 activations (engine/tiledot.py) vs obvious references."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize
from numba import njit

from engine import kernels as K
from engine import tiledot as T
from engine.quantize import quantize_q8_0

RNG = np.random.default_rng(5)


def _tiles(raw: np.ndarray) -> np.ndarray:
    out = np.empty((-(-raw.shape[0] // T.TILE), raw.shape[1] // 34 * T.TILE_BLOCK), np.uint8)
    T.repack_q8_0_tiles(raw, out)
    return out


def _weight(rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    raw = quantize_q8_0((RNG.standard_normal((rows, cols)) * RNG.uniform(0.1, 3, (rows, 1))).astype(np.float32))
    return raw, _tiles(raw)


def _quantize_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The obvious activation quantizer: per 32 values, d = max|x| / 32767, q = round-half-even(x / d)."""
    xb = x.reshape(x.shape[0], -1, 32)
    d = (np.abs(xb).max(axis=2) / np.float32(32767)).astype(np.float32)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    return np.rint(xb * inv[:, :, None]).astype(np.int16).reshape(x.shape), d


def test_tile_layout_round_trips_and_pads_with_zero_rows() -> None:
    raw, tiles = _weight(37, 96)  # 3 tiles, the last with 5 real rows
    assert tiles.shape == (3, 3 * 544)
    back = np.empty((37, 96), np.float32)
    T.dq_rows_q8_0x16(tiles, np.arange(37, dtype=np.int64), back, K.F16_LUT, 32)
    assert np.array_equal(back, dequantize(raw, QT.Q8_0))
    t = tiles[2].reshape(3, 544)
    assert not t[:, 2 * 5: 32].any()  # padding rows' scales
    q = t[:, 32:].reshape(3, 16, 16, 2)  # [block, pair k, row, 2]
    assert not q[:, :, 5:].any() and q[:, :, :5].any()
    # row 33 = tile 2 row 1: block 1's values 2k, 2k+1 sit at 32 + 32k + 2, +3
    want = raw[33, 34 + 2: 34 + 34]
    assert np.array_equal(q[1, :, 1].reshape(32), want)


def test_tile_range_dequantizes_whole_tiles_like_the_row_kernel() -> None:
    raw, tiles = _weight(53, 320)  # 4 tiles, the last with 5 rows
    ref = dequantize(raw, QT.Q8_0)
    for t0, nrows in ((0, 53), (1, 37), (3, 5), (2, 16)):
        out = np.full((nrows, 320), np.nan, np.float32)
        T.dq_tile_range(tiles, t0, out)
        assert np.array_equal(out, ref[16 * t0: 16 * t0 + nrows])
    with pytest.raises(ValueError, match="shapes"):
        T.dq_tile_range(tiles, 3, np.empty((17, 320), np.float32))  # past the last tile
    with pytest.raises(ValueError, match="contiguous"):
        T.dq_tile_range(tiles, 0, np.empty((16, 640), np.float32)[:, :320])


def test_activation_quantizer_matches_the_obvious_one() -> None:
    x = (RNG.standard_normal((5, 128)) * np.array([1e-3, 1, 50, 1e4, 0])[:, None]).astype(np.float32)
    x[1, 40] = 3e4  # one big value: its block's step grows, the others' do not
    xq, dx = np.empty(x.shape, np.int16), np.empty((5, 4), np.float32)
    T.quantize_rows_i16(x, xq, dx)
    wq, wd = _quantize_ref(x)
    assert np.array_equal(dx, wd) and np.array_equal(xq, wq)
    assert np.abs(xq).max() == 32767 and not xq[4].any() and not dx[4].any()


@pytest.mark.parametrize("rows,cols", [(37, 96), (256, 640), (16, 2048)])
def test_gemm_tiles_matches_float64_reference(rows: int, cols: int) -> None:
    raw, tiles = _weight(rows, cols)
    x = (RNG.standard_normal((6, cols)) * 3).astype(np.float32)
    out = np.empty((6, rows), np.float32)
    T.gemm_tiles(tiles, x, out)
    xq, dx = _quantize_ref(x)
    xhat = (xq.reshape(6, -1, 32) * dx[:, :, None].astype(np.float64)).reshape(x.shape)
    w = dequantize(raw, QT.Q8_0).astype(np.float64)
    scale = np.abs(xhat) @ np.abs(w).T
    assert np.all(np.abs(out - xhat @ w.T) <= 2e-6 * scale + 1e-6)  # the integer dots are exact
    # and the float activations are within half a quantization step per value
    half = (dx.astype(np.float64) / 2) @ np.abs(w).reshape(rows, -1, 32).sum(axis=2).T
    assert np.all(np.abs(out - x.astype(np.float64) @ w.T) <= half + 2e-6 * scale + 1e-6)


def test_a_lane_gets_the_same_bits_in_any_batch() -> None:
    raw, tiles = _weight(50, 320)
    x = RNG.standard_normal((19, 320)).astype(np.float32)
    full = np.empty((19, 50), np.float32)
    T.gemm_tiles(tiles, x, full)
    for b in (1, 3, 4, 5, 8, 9, 13):  # groups of 8, 4 and 1 in every mix
        part = np.empty((b, 50), np.float32)
        T.gemm_tiles(tiles, x[19 - b:], part)
        assert np.array_equal(part, full[19 - b:])


def test_non_finite_activations_poison_only_their_lane() -> None:
    raw, tiles = _weight(20, 64)
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    x[1, 7] = np.inf
    out = np.empty((3, 20), np.float32)
    T.gemm_tiles(tiles, x, out)
    assert np.isnan(out[1]).all() and np.isfinite(out[[0, 2]]).all()


def test_shapes_are_checked() -> None:
    raw, tiles = _weight(20, 64)
    with pytest.raises(ValueError, match="shapes"):
        T.gemm_tiles(tiles, np.zeros((1, 96), np.float32), np.empty((1, 20), np.float32))
    with pytest.raises(ValueError, match="shapes"):
        T.gemm_tiles(tiles, np.zeros((1, 64), np.float32), np.empty((1, 33), np.float32))  # 3 tiles' worth
    with pytest.raises(ValueError, match="shapes"):
        T.repack_q8_0_tiles(raw, np.empty((1, 2 * 544), np.uint8))


def test_portable_ir_gives_the_vnni_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without AVX-512 VNNI the same integer sums come from plain IR (multiply, pair add)."""
    raw, tiles = _weight(32, 128)
    x = RNG.standard_normal((1, 128)).astype(np.float32) * 100
    xq, dx = np.empty((1, 128), np.int16), np.empty((1, 4), np.float32)
    T.quantize_rows_i16(x, xq, dx)
    monkeypatch.setattr(T, "HAS_VNNI", False)
    portable = T._tile_lanes(1)

    @njit
    def run(tiles, xq, dx, out):  # type: ignore[no-untyped-def]
        for t in range(tiles.shape[0]):
            portable(T.U(tiles.ctypes.data) + T.U(t * tiles.strides[0]), xq, dx, 0, 4,
                     T.U(out.ctypes.data) + T.U(64 * t), T.U(128), 16)

    got = np.empty((1, 32), np.float32)
    run(tiles, xq, dx, got)
    want = np.empty((1, 32), np.float32)
    T.gemm_tiles(tiles, x, want)
    assert np.array_equal(got, want)
