"""Int16 tiles built at run time (prefill attention's operands) and their products, against the obvious
float64 arithmetic over the same quantized values."""

from __future__ import annotations

import numpy as np
import pytest

from engine.kernels import i16tile
from engine.kernels.i16tile import (
    LIMIT,
    QB,
    TILE,
    block_count,
    build_tiles,
    build_tiles_t,
    quantize_rows,
    tile_count,
    tile_products,
)


def _tiles(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    nt, nb = tile_count(a.shape[0]), block_count(a.shape[1])
    vals = np.full((nt, nb, TILE, TILE), 7, np.int32)  # garbage in: padding must come out zero
    scales = np.full((nt, nb, TILE), 7.0, np.float32)
    build_tiles(np.ascontiguousarray(a), vals, scales)
    return vals, scales


def _dequant_tiles(vals: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Tiles back to float64 rows [tiles * 16, blocks * 32], straight from the documented layout."""
    nt, nb = vals.shape[:2]
    q16 = vals.view(np.int16).reshape(nt, nb, TILE, TILE, 2)  # [t, b, pair k, row i, half]: value 2k + half
    rows = q16.transpose(0, 3, 1, 2, 4).reshape(nt * TILE, nb * QB).astype(np.float64)
    return rows * np.repeat(scales.transpose(0, 2, 1).reshape(nt * TILE, nb), QB, axis=1)


def _quant(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    nb = block_count(x.shape[1])
    xq = np.full((x.shape[0], nb * QB), 7, np.int16)
    dx = np.empty((x.shape[0], nb), np.float32)
    quantize_rows(np.ascontiguousarray(x), x.shape[1], xq, dx)
    return xq, dx


@pytest.mark.parametrize("rows,cols", [(16, 32), (37, 64), (5, 70), (512, 64), (64, 512)])
def test_tiles_hold_each_value_within_half_a_step_of_its_block(rows: int, cols: int) -> None:
    rng = np.random.default_rng(rows * cols)
    a = (rng.standard_normal((rows, cols)) * rng.choice([1e-3, 1.0, 50.0], (rows, 1))).astype(np.float32)
    vals, scales = _tiles(a)
    back = _dequant_tiles(vals, scales)
    step = np.repeat(scales.transpose(0, 2, 1).reshape(-1, scales.shape[1]), QB, axis=1)[:rows, :cols]
    assert np.all(np.abs(back[:rows, :cols] - a) <= 0.501 * step)  # half a step, and x * (1 / d) in float32
    assert np.all(back[rows:] == 0) and np.all(back[:, cols:] == 0)  # padding is zero
    assert np.abs(vals.view(np.int16)).max() == LIMIT  # each block's largest value is the full range
    blocks = a.reshape(rows, -1) if cols % QB == 0 else None
    if blocks is not None:
        np.testing.assert_allclose(scales.transpose(0, 2, 1).reshape(-1, cols // QB)[:rows],
                                   np.abs(a).reshape(rows, cols // QB, QB).max(axis=2) / LIMIT, rtol=1e-6)


@pytest.mark.parametrize("rows,cols", [(37, 64), (64, 512), (5, 70), (16, 33), (512, 64)])
def test_transposed_build_gives_the_same_tiles(rows: int, cols: int) -> None:
    a = np.random.default_rng(rows + cols).standard_normal((rows, cols)).astype(np.float32)
    vals, scales = _tiles(a)
    vt = np.full_like(vals, 7)
    st = np.full_like(scales, 7.0)
    build_tiles_t(np.ascontiguousarray(a.T), vt, st)
    np.testing.assert_array_equal(vt, vals)
    np.testing.assert_array_equal(st, scales)


def test_quantized_rows_within_half_a_step_and_zero_past_the_columns() -> None:
    x = np.random.default_rng(3).standard_normal((9, 70)).astype(np.float32)
    xq, dx = _quant(x)
    back = xq.astype(np.float64) * np.repeat(dx, QB, axis=1)
    assert np.all(np.abs(back[:, :70] - x) <= 0.501 * np.repeat(dx, QB, axis=1)[:, :70])
    assert np.all(xq[:, 70:] == 0) and np.abs(xq).max() == LIMIT


@pytest.mark.parametrize("rows,cols,lanes", [(37, 64, 13), (512, 64, 70), (64, 512, 9), (16, 32, 1), (5, 70, 12)])
def test_products_are_exact_over_the_quantized_values(rows: int, cols: int, lanes: int) -> None:
    """Integer sums are exact: the product equals float64 arithmetic over the two quantized operands but for
    the float32 per-block scaling (relative 1e-6), and the columns past `rows` are left alone."""
    rng = np.random.default_rng(rows + lanes)
    a = rng.standard_normal((rows, cols)).astype(np.float32)
    x = rng.standard_normal((lanes, cols)).astype(np.float32)
    vals, scales = _tiles(a)
    xq, dx = _quant(x)
    out = np.full((lanes, rows + 3), np.nan, np.float32)
    tile_products(vals, scales, rows, xq, dx, out)
    qx = xq.astype(np.float64) * np.repeat(dx, QB, axis=1)
    want = qx @ _dequant_tiles(vals, scales)[:rows].T
    assert np.abs(out[:, :rows] - want).max() <= 1e-5 * np.abs(want).max()
    assert np.isnan(out[:, rows:]).all()
    exact = x.astype(np.float64) @ a.T.astype(np.float64)  # and the quantization costs ~1e-4 of the scale
    assert np.abs(out[:, :rows] - exact).max() < 3e-4 * np.abs(exact).max()


def test_a_rows_product_does_not_depend_on_its_lane_group() -> None:
    """Lanes meet a tile 8, 4 or 1 at a time: each lane's bits are the same alone or in any batch."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((40, 96)).astype(np.float32)
    x = rng.standard_normal((29, 96)).astype(np.float32)
    vals, scales = _tiles(a)
    xq, dx = _quant(x)
    whole = np.empty((29, 40), np.float32)
    tile_products(vals, scales, 40, xq, dx, whole)
    for lo, hi in ((0, 1), (3, 7), (5, 13), (28, 29)):
        part = np.empty((hi - lo, 40), np.float32)
        tile_products(vals, scales, 40, np.ascontiguousarray(xq[lo:hi]), np.ascontiguousarray(dx[lo:hi]), part)
        np.testing.assert_array_equal(part, whole[lo:hi])


def test_blocks_at_the_full_range_do_not_overflow() -> None:
    """Every value at the limit with one sign: 32 products of LIMIT^2 a block must fit the int32 sum
    (at int16's own 32767 they do not: the sum wraps)."""
    a = np.full((16, 128), 3.0, np.float32)
    x = np.full((8, 128), -2.0, np.float32)
    vals, scales = _tiles(a)
    xq, dx = _quant(x)
    out = np.empty((8, 16), np.float32)
    tile_products(vals, scales, 16, xq, dx, out)
    np.testing.assert_allclose(out, -6.0 * 128, rtol=1e-6)


def test_inf_or_nan_in_a_block_makes_its_products_nan() -> None:
    a = np.ones((16, 64), np.float32)
    a[3, 40] = np.nan
    a[7, 2] = np.inf
    x = np.ones((2, 64), np.float32)
    vals, scales = _tiles(a)
    assert np.isnan(scales[0, 1, 3]) and np.isnan(scales[0, 0, 7]) and not np.isnan(scales[0, 0, 3])
    xq, dx = _quant(x)
    out = np.empty((2, 16), np.float32)
    tile_products(vals, scales, 16, xq, dx, out)
    assert np.isnan(out[:, [3, 7]]).all() and np.isfinite(np.delete(out, [3, 7], axis=1)).all()
    x[1, 10] = np.nan
    xq, dx = _quant(x)
    assert np.isnan(dx[1, 0]) and not np.isnan(dx[0, 0]) and np.all(xq[1, :32] == 0)


def test_shapes_that_do_not_match_are_refused() -> None:
    vals, scales = _tiles(np.ones((16, 64), np.float32))
    xq, dx = _quant(np.ones((4, 96), np.float32))  # 3 blocks against tiles of 2
    with pytest.raises(ValueError, match="tiles, activations and output do not match"):
        tile_products(vals, scales, 16, xq, dx, np.empty((4, 16), np.float32))
    with pytest.raises(ValueError, match="the tiles do not hold the matrix"):
        build_tiles(np.ones((17, 64), np.float32), vals, scales)
    assert i16tile.BLOCK_BYTES == TILE * TILE * 4
