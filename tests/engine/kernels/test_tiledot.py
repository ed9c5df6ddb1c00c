"""16-row tiles x int16 activations (engine/quant/tiles.py, tiledot.py, tilegemm.py) vs obvious references."""

from __future__ import annotations

import re

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize
from numba import njit

from engine.kernels import tiledot
from engine.kernels import tilegemm as T
from engine.quant import tiles as L
from support.blocks import random_blocks

RNG = np.random.default_rng(5)
KINDS = [(L.KINDS.index(t.name), t, L.SB_VALUES[L.KINDS.index(t.name)])
         for t in (QT.Q8_0, QT.Q5_0, QT.Q4_K, QT.Q6_K, QT.Q4_0, QT.Q4_1, QT.Q5_1, QT.Q5_K, QT.F16, QT.BF16)]
FLOAT = [k for k in KINDS if k[0] >= L.FLOAT_KINDS]
IDS = [k[1].name for k in KINDS]


def _tiles(kind: int, raw: np.ndarray, n: int) -> np.ndarray:
    out = np.empty(L.tiled_shape(kind, raw.shape[0], n), np.uint8)
    L.repack_tiles(kind, raw, out)
    return out


def _weight(kind: int, qtype: QT, rows: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    raw = random_blocks(qtype, rows, n, seed=seed)
    return raw, _tiles(kind, raw, n)


def _quantize_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The obvious activation quantizer: per 32 values, d = max|x| / 32767, q = round-half-even(x / d)."""
    xb = x.reshape(x.shape[0], -1, 32)
    d = (np.abs(xb).max(axis=2) / np.float32(32767)).astype(np.float32)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    return np.rint(xb * inv[:, :, None]).astype(np.int16).reshape(x.shape), d


@pytest.mark.parametrize("kind,qtype,sb", KINDS, ids=IDS)
@pytest.mark.slow
def test_tiles_dequantize_to_the_gguf_values(kind: int, qtype: QT, sb: int) -> None:
    rows, n = 37, 2 * sb * (2 if sb == 32 else 1)  # 3 tiles, the last with 5 real rows
    raw, tiles = _weight(kind, qtype, rows, n, seed=kind)
    assert tiles.shape == (3, n // sb * L.SB_BYTES[kind])
    ref = dequantize(raw, qtype)
    got = np.full((37, n), np.nan, np.float32)
    T.dq_rows_for(kind)(kind, tiles, np.arange(37, dtype=np.int64), got)
    assert np.array_equal(got, ref)  # the same float32 products
    ids = np.array([36, 0, 17, 17, 5], dtype=np.int64)
    got = np.empty((5, n), np.float32)
    T.dq_rows_for(kind)(kind, tiles, ids, got)
    assert np.array_equal(got, ref[ids])
    # padding rows are zero bytes, real rows are not
    pad = np.empty((11, n), np.float32)
    T.dq_rows_for(kind)(kind, tiles, np.arange(37, 48, dtype=np.int64), pad)
    assert not pad.any() and ref[32:].any()


def test_q8_0_pair_layout() -> None:
    raw, tiles = _weight(0, QT.Q8_0, 37, 96)
    q = tiles[2].reshape(3, 544)[:, 32:].reshape(3, 16, 16, 2)  # [block, pair k, row, 2]
    # row 33 = tile 2 row 1: block 1's values 2k, 2k+1
    assert np.array_equal(q[1, :, 1].reshape(32), raw[33, 34 + 2: 34 + 34])


def test_activation_quantizer_matches_the_obvious_one() -> None:
    x = (RNG.standard_normal((5, 128)) * np.array([1e-3, 1, 50, 1e4, 0])[:, None]).astype(np.float32)
    x[1, 40] = 3e4  # one big value: its block's step grows, the others' do not
    xq, dx, sxd = np.empty(x.shape, np.int16), np.empty((5, 4), np.float32), np.empty((5, 4), np.float32)
    T.quantize_rows_i16(x, xq, dx, sxd)
    wq, wd = _quantize_ref(x)
    assert np.array_equal(dx, wd) and np.array_equal(xq, wq)
    assert np.array_equal(sxd, wd * xq.reshape(5, 4, 32).sum(axis=2).astype(np.float32))
    assert np.abs(xq).max() == 32767 and not xq[4].any() and not dx[4].any()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("at", [0, 1, 17, 31])
def test_a_block_holding_a_non_finite_value_quantizes_to_nan_wherever_it_sits(bad: float, at: int) -> None:
    """A NaN anywhere in a block was missed by the float max() this replaced (max(0, nan) is 0): its block got
    a finite scale and the NaN became a 0, so the product lost it (inf was caught). Only that block of that
    row turns NaN."""
    x = RNG.standard_normal((9, 96)).astype(np.float32)
    x[3, 32 + at] = bad
    xq, dx, sxd = np.empty(x.shape, np.int16), np.empty((9, 3), np.float32), np.empty((9, 3), np.float32)
    T.quantize_rows_i16(x, xq, dx, sxd)
    assert np.isnan(dx[3, 1]) and np.isnan(sxd[3, 1]) and not xq[3, 32:64].any()
    assert np.isfinite(np.delete(dx.ravel(), 3 * 3 + 1)).all()
    raw, tiles = _weight(0, QT.Q8_0, 20, 96)
    for rows in (9, T.PAR_QUANTIZE[1] // 96 + 1):  # gemm_tiles quantizes these serially, then a row per worker
        xs = np.concatenate([x] * (rows // 9 + 1))[:rows]
        out = np.empty((rows, 20), np.float32)
        T.gemm_for(0)(0, tiles, xs, out)
        bad = np.arange(3, rows, 9)
        assert np.isnan(out[bad]).all() and np.isfinite(np.delete(out, bad, axis=0)).all()


def test_parallel_quantizing_gives_the_serial_bits() -> None:
    """gemm_tiles quantizes >= PAR_QUANTIZE values a row per worker; every row's product is the bits it gets alone."""
    raw, tiles = _weight(3, QT.Q6_K, 40, 512)
    rows = max(T.PAR_QUANTIZE[0], T.PAR_QUANTIZE[1] // 512) + 3
    x = (RNG.standard_normal((rows, 512)) * RNG.lognormal(0, 2, (rows, 512))).astype(np.float32)
    full = np.empty((x.shape[0], 40), np.float32)
    T.gemm_for(3)(3, tiles, x, full)
    for r in range(x.shape[0]):
        one = np.empty((1, 40), np.float32)
        T.gemm_for(3)(3, tiles, x[r:r + 1], one)
        assert np.array_equal(one[0], full[r])


@pytest.mark.parametrize("kind,qtype,sb", KINDS, ids=IDS)
@pytest.mark.parametrize("rows,mult", [(37, 1), (256, 3), (16, 8)])
@pytest.mark.slow
def test_gemm_tiles_matches_float64_reference(kind: int, qtype: QT, sb: int, rows: int, mult: int) -> None:
    n = max(sb, 64) * mult
    raw, tiles = _weight(kind, qtype, rows, n, seed=rows + kind)
    x = (RNG.standard_normal((6, n)) * 3).astype(np.float32)
    out = np.empty((6, rows), np.float32)
    T.gemm_for(kind)(kind, tiles, x, out)
    xq, dx = _quantize_ref(x)
    xhat = (xq.reshape(6, -1, 32) * dx[:, :, None].astype(np.float64)).reshape(x.shape)
    if kind >= L.FLOAT_KINDS:  # float tiles take x itself (float32 FMAs: rounding grows with n)
        xhat, dx, tol = x.astype(np.float64), np.zeros_like(dx), 1e-5
    else:
        tol = 2e-6
    w = dequantize(raw, qtype).astype(np.float64)
    scale = np.abs(xhat) @ np.abs(w).T
    assert np.all(np.abs(out - xhat @ w.T) <= tol * scale + 1e-6)  # the integer dots are exact
    # and the float activations are within half a quantization step per value (+ float32 rounding)
    half = (dx.astype(np.float64) * 0.504) @ np.abs(w).reshape(rows, -1, 32).sum(axis=2).T
    assert np.all(np.abs(out - x.astype(np.float64) @ w.T) <= half + tol * scale + 1e-6)


@pytest.mark.parametrize("kind,qtype,sb", KINDS, ids=IDS)
def test_a_lane_gets_the_same_bits_in_any_batch(kind: int, qtype: QT, sb: int) -> None:
    n = 2 * max(sb, 160)
    raw, tiles = _weight(kind, qtype, 50, n, seed=3)
    x = RNG.standard_normal((19, n)).astype(np.float32)
    full = np.empty((19, 50), np.float32)
    T.gemm_for(kind)(kind, tiles, x, full)
    for b in (1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13):  # groups of 8, 4 and 1 in every mix
        part = np.empty((b, 50), np.float32)
        T.gemm_for(kind)(kind, tiles, x[19 - b:], part)
        assert np.array_equal(part, full[19 - b:])


def test_prefill_sized_batches_pass_in_lane_blocks() -> None:
    """Past LANE_BLOCK lanes the tiles meet the lanes block by block: the same bits per lane."""
    raw, tiles = _weight(2, QT.Q4_K, 48, 512, seed=4)
    x = RNG.standard_normal((T.LANE_BLOCK * 2 + 13, 512)).astype(np.float32)
    full = np.empty((x.shape[0], 48), np.float32)
    T.gemm_for(2)(2, tiles, x, full)
    for lo, hi in ((0, 1), (60, 70), (T.LANE_BLOCK * 2, x.shape[0])):
        part = np.empty((hi - lo, 48), np.float32)
        T.gemm_for(2)(2, tiles, x[lo:hi], part)
        assert np.array_equal(part, full[lo:hi])


def test_non_finite_activations_poison_only_their_lane() -> None:
    raw, tiles = _weight(2, QT.Q4_K, 20, 256)
    x = RNG.standard_normal((3, 256)).astype(np.float32)
    x[1, 7] = np.inf
    out = np.empty((3, 20), np.float32)
    T.gemm_for(2)(2, tiles, x, out)
    assert np.isnan(out[1]).all() and np.isfinite(out[[0, 2]]).all()


def test_shapes_are_checked() -> None:
    raw, tiles = _weight(0, QT.Q8_0, 20, 64)
    with pytest.raises(ValueError, match="shapes"):
        T.gemm_for(0)(0, tiles, np.zeros((1, 96), np.float32), np.empty((1, 20), np.float32))
    with pytest.raises(ValueError, match="shapes"):
        T.gemm_for(0)(0, tiles, np.zeros((1, 64), np.float32), np.empty((1, 33), np.float32))  # 3 tiles' worth
    with pytest.raises(ValueError, match="shapes"):
        T.gemm_for(1)(1, tiles, np.zeros((1, 64), np.float32),  # another kind's bytes
                     np.empty((1, 20), np.float32))
    with pytest.raises(ValueError, match="shapes"):
        L.repack_tiles(0, raw, np.empty((1, 2 * 544), np.uint8))
    with pytest.raises(ValueError, match="shapes"):
        T.dq_rows_for(0)(0, tiles, np.array([3], np.int64), np.empty((1, 96), np.float32))
    with pytest.raises(ValueError, match="out of range"):
        T.dq_rows_for(0)(0, tiles, np.array([32], np.int64), np.empty((1, 64), np.float32))


def test_a_kind_outside_the_compiled_group_is_refused() -> None:
    """A group's kernels hold the bodies of its kinds only: another kind is refused, not skipped (the output
    would be left unwritten)."""
    _, tiles = _weight(0, QT.Q8_0, 20, 64)
    x, out = np.zeros((1, 64), np.float32), np.full((1, 20), 7.0, np.float32)
    for other in (4, 8):  # Q4_0's group, F16's
        with pytest.raises(ValueError, match="not one this compilation holds"):
            T.gemm_for(other)(0, tiles, x, out)
        with pytest.raises(ValueError, match="not one this compilation holds"):
            T.dq_rows_for(other)(0, tiles, np.array([3], np.int64), np.empty((1, 64), np.float32))
    with pytest.raises(ValueError, match="not one this compilation holds"):
        T.gemm_for(0)(10, tiles, x, out)
    assert (out == 7.0).all()
    assert T.gemm_for(3) is T.gemm_for(0) and T.gemm_for(4) is not T.gemm_for(0)  # one compilation a group


def test_groups_cover_every_kind_once() -> None:
    assert sum(L.KIND_GROUPS) == L.ALL_KINDS == (1 << len(L.KINDS)) - 1
    assert all(a & b == 0 for i, a in enumerate(L.KIND_GROUPS) for b in L.KIND_GROUPS[i + 1:])
    assert [L.kind_group(k) for k in range(len(L.KINDS))] == [L.KIND_GROUPS[0]] * 4 + [L.KIND_GROUPS[1]] * 4 + [
        L.KIND_GROUPS[2]] * 2
    with pytest.raises(ValueError):
        L.kind_group(10)


def test_a_mask_compiles_only_its_kinds_bodies() -> None:
    """What shortens the first run: a specialisation's IR holds a body per kind in its mask, no other."""
    U = np.uint64

    @njit
    def group_a(kind, tiles, xq, dx, sxd, x, out):  # type: ignore[no-untyped-def]
        tiledot.tdot8(0x00F, kind, U(tiles.ctypes.data), xq, dx, sxd, x, 0, 1, U(out.ctypes.data), U(64), 16)

    @njit
    def everything(kind, tiles, xq, dx, sxd, x, out):  # type: ignore[no-untyped-def]
        tiledot.tdot8(0x3FF, kind, U(tiles.ctypes.data), xq, dx, sxd, x, 0, 1, U(out.ctypes.data), U(64), 16)

    args = (0, np.zeros((1, 544), np.uint8), np.zeros((8, 32), np.int16), np.zeros((8, 1), np.float32),
            np.zeros((8, 1), np.float32), np.zeros((8, 32), np.float32), np.zeros((8, 16), np.float32))
    group_a(*args)
    everything(*args)
    ir_a = "".join(group_a.inspect_llvm().values())
    ir_all = "".join(everything.inspect_llvm().values())
    for code, name in enumerate(L.KINDS):
        body = re.compile(rf"^define [^@\n]*@fak_tdot8_{name}_", re.M)
        assert bool(body.search(ir_a)) == (code < 4), name
        assert body.search(ir_all), name

    @njit
    def not_literal(mask, kind, tiles, xq, dx, sxd, x, out):  # type: ignore[no-untyped-def]
        tiledot.tdot8(mask, kind, U(tiles.ctypes.data), xq, dx, sxd, x, 0, 1, U(out.ctypes.data), U(64), 16)

    with pytest.raises(Exception, match="literal bit mask"):
        not_literal(15, *args)


def test_portable_ir_gives_the_vnni_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without AVX-512 VNNI the same integer sums come from plain IR (multiply, pair add)."""
    raw, tiles = _weight(3, QT.Q6_K, 32, 256)
    x = RNG.standard_normal((1, 256)).astype(np.float32) * 100
    xq, dx, sxd = np.empty((1, 256), np.int16), np.empty((1, 8), np.float32), np.empty((1, 8), np.float32)
    T.quantize_rows_i16(x, xq, dx, sxd)
    monkeypatch.setattr(tiledot, "HAS_VNNI", False)
    portable = tiledot._tile_any(1)  # compiled below, while HAS_VNNI is False
    U = np.uint64

    @njit
    def run(tiles, xq, dx, sxd, x, out):  # type: ignore[no-untyped-def]
        for t in range(tiles.shape[0]):
            portable(8, 3, U(tiles.ctypes.data) + U(t * tiles.strides[0]), xq, dx, sxd, x, 0, 1,
                     U(out.ctypes.data) + U(64 * t), U(128), 16)

    got = np.empty((1, 32), np.float32)
    run(tiles, xq, dx, sxd, x, got)
    want = np.empty((1, 32), np.float32)
    T.gemm_for(3)(3, tiles, x, want)
    assert np.array_equal(got, want)
