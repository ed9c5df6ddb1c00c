"""AMX tile products (engine/kernels/amxdot.py): the same bits as the vpdpwssd tile dot, lane for lane."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from numba import njit

from engine.kernels import amxdot as A
from engine.kernels import tilegemm as T
from engine.kernels.parallel import specialised
from engine.quant import tiles as L
from support.blocks import random_blocks

pytestmark = pytest.mark.skipif(not A.amx_ready(), reason="no AMX int8 tiles on this CPU (or FAK_AMX=0)")

RNG = np.random.default_rng(11)
AMX_TYPES = [QT.Q8_0, QT.Q5_0, QT.Q4_K, QT.Q4_0, QT.Q4_1, QT.Q5_1, QT.Q5_K]
OTHER_TYPES = [QT.Q6_K, QT.F16]  # not AMX kinds: gemm_tiles keeps them on vpdpwssd / FMA


def _tiles(qtype: QT, rows: int, n: int, seed: int) -> tuple[int, np.ndarray]:
    kind = L.KINDS.index(qtype.name)
    raw = random_blocks(qtype, rows, n, seed=seed)
    out = np.empty(L.tiled_shape(kind, rows, n), np.uint8)
    L.repack_tiles(kind, raw, out)
    return kind, out


def _vnni(kind: int) -> object:
    return specialised(T.gemm_tiles, KINDS_IN=L.kind_group(kind), AMX=0)


def test_split_rows_rebuild_every_int16() -> None:
    xq = np.arange(-32768, 32768, dtype=np.int16).reshape(16, -1)  # 16 lanes of 4096 values: 128 blocks
    xpk = np.empty((128, 16, 64), np.int8)
    split = njit(lambda a, b, j: A.split_row(a, b, j))
    for j in range(16):
        split(xq[j], xpk, j)
    hi, lo = xpk[:, :, :32].astype(np.int32), xpk[:, :, 32:].view(np.uint8).astype(np.int32)
    assert np.array_equal((256 * hi + lo).transpose(1, 0, 2).reshape(16, -1), xq.astype(np.int32))


@pytest.mark.parametrize("qtype", AMX_TYPES + OTHER_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("lanes", [16, 37, 80])
def test_amx_products_are_the_vpdpwssd_bits(qtype: QT, lanes: int) -> None:
    """Every lane of a 16-lane AMX group, and the lanes past the last group (vpdpwssd), against the product
    with AMX off: bit for bit, with activations spanning int16 (extreme, zero and tiny blocks) and a partial
    last tile of weight rows."""
    sb = L.SB_VALUES[L.KINDS.index(qtype.name)]
    n, rows = max(sb, 64) * (2 if sb == 256 else 9), 45
    kind, tiles = _tiles(qtype, rows, n, seed=lanes)
    x = (RNG.standard_normal((lanes, n)) * RNG.lognormal(0, 3, (lanes, 1))).astype(np.float32)
    x[1, :32] = 0  # a zero block
    x[2, 40] = 3e4  # one large value: the block's other values land in few steps
    x[3] = np.float32(1e-30)
    x[5, 7] = -np.float32(7e4)
    got, want = np.empty((lanes, rows), np.float32), np.empty((lanes, rows), np.float32)
    T.gemm_for(kind)(kind, tiles, x, got)
    _vnni(kind)(kind, tiles, x, want)
    assert np.array_equal(got.view(np.int32), want.view(np.int32))
    assert np.isfinite(got).all()


def test_amx_path_runs_and_a_lane_keeps_its_bits_in_any_batch() -> None:
    """A lane's row is the same alone (vpdpwssd, 1 lane) as in a batch of 32 (two AMX groups): the rule the
    scheduler's batching and speculation rely on. And AMX is the path taken: a product with the weights'
    kind bound out of AMX_KINDS's reach is not the same function."""
    kind, tiles = _tiles(QT.Q5_0, 64, 896, seed=3)
    x = RNG.standard_normal((32, 896)).astype(np.float32)
    full = np.empty((32, 64), np.float32)
    T.gemm_for(kind)(kind, tiles, x, full)
    for r in (0, 15, 16, 31):
        one = np.empty((1, 64), np.float32)
        T.gemm_for(kind)(kind, tiles, x[r:r + 1], one)
        assert np.array_equal(one[0], full[r])
    assert T.gemm_for(kind) is specialised(T.gemm_tiles, KINDS_IN=L.kind_group(kind), AMX=1)
