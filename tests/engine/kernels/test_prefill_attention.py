"""The prefill attention (BLAS float32 products, or int16 tiles) against the float64 reference and the numba
paged kernel."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import EngineError
from engine.kernels import kvtype
from engine.kernels.attention import gather_rows, paged_attention, prefill_attention, reference_attention


def _pool(seed: int, n_blocks: int = 80, bt: int = 16, kvh: int = 2, dim: int = 64):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((n_blocks, bt, kvh, dim)).astype(np.float32)
    v = rng.standard_normal((n_blocks, bt, kvh, dim)).astype(np.float32)
    return rng, k, v, [int(b) for b in rng.permutation(n_blocks)[:60]]


CASES = [
    (0, 300, 0, 0.0),  # two query tiles, causal from position 0
    (100, 600, 0, 0.0),  # a chunk after earlier KV, three tiles
    (37, 500, 128, 0.0),  # sliding window narrower than a tile
    (0, 64, 0, 30.0),  # soft-capped scores
    (500, 100, 64, 0.0),  # window, keys far behind the first query
]


@pytest.mark.parametrize("start,rows,window,softcap", CASES)
def test_prefill_attention_matches_reference(start: int, rows: int, window: int, softcap: float) -> None:
    rng, kp, vp, blocks = _pool(start + rows)
    q = rng.standard_normal((rows, 8, 64)).astype(np.float32)
    bt = kp.shape[1]
    pos = np.arange(start + rows)
    table = np.asarray(blocks)
    ref = reference_attention(q, kp[table[pos // bt], pos % bt], vp[table[pos // bt], pos % bt], start, window,
                              0.125, softcap)
    got = prefill_attention(q, kp, vp, blocks, start, window, 0.125, softcap)  # a float32 pool: BLAS
    kernel = paged_attention(q, kp, vp, blocks, start, window, 0.125, softcap)
    assert got.shape == q.shape and got.dtype == np.float32
    assert np.abs(got - ref).max() < 5e-6
    assert np.abs(got - kernel).max() < 5e-6
    np.testing.assert_array_equal(got, prefill_attention(q, kp, vp, blocks, start, window, 0.125, softcap, "f32"))


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


@pytest.mark.parametrize("start,rows,window,softcap", CASES)
def test_int16_products_err_less_than_an_f16_kv_cache_does(start: int, rows: int, window: int, softcap: float) -> None:
    """The int16 tiles' error against the float64 reference, on a float32 pool, stays below what rounding the
    same K/V to f16 (the default KV cache) costs the float32 products: on every case, in rms and in max."""
    rng, kp, vp, blocks = _pool(start + rows)
    q = rng.standard_normal((rows, 8, 64)).astype(np.float32)
    bt, pos, table = kp.shape[1], np.arange(start + rows), np.asarray(blocks)
    ref = reference_attention(q, kp[table[pos // bt], pos % bt], vp[table[pos // bt], pos % bt], start, window,
                              0.125, softcap)
    got = prefill_attention(q, kp, vp, blocks, start, window, 0.125, softcap, "i16")
    st = kvtype.storage("f16")
    f16 = prefill_attention(q, kvtype.encode(kp, st), kvtype.encode(vp, st), blocks, start, window, 0.125, softcap,
                            "f32")
    assert got.shape == q.shape and got.dtype == np.float32
    assert 0 < _rms(got - ref) < _rms(f16 - ref)
    assert np.abs(got - ref).max() < np.abs(f16 - ref).max()
    assert np.abs(got - ref).max() < 1e-3


def test_products_must_be_named() -> None:
    rng, kp, vp, blocks = _pool(1)
    q = rng.standard_normal((64, 8, 64)).astype(np.float32)
    with pytest.raises(EngineError, match="products must be f32 or i16, not 'f64'"):
        prefill_attention(q, kp, vp, blocks, 0, products="f64")


@pytest.mark.parametrize("products", ["f32", "i16"])
def test_prefill_attention_masks_the_future(products: str) -> None:
    """Changing keys after the last query position must not change any output row."""
    rng, kp, vp, blocks = _pool(7)
    q = rng.standard_normal((100, 8, 64)).astype(np.float32)
    a = prefill_attention(q, kp, vp, blocks, 0, products=products)
    bt = kp.shape[1]
    for p in range(100, 60 * bt):  # every later position of the lane
        kp[blocks[p // bt], p % bt] += 100.0
        vp[blocks[p // bt], p % bt] = np.nan
    np.testing.assert_array_equal(prefill_attention(q, kp, vp, blocks, 0, products=products), a)


def test_attention_refuses_positions_outside_the_lanes_blocks() -> None:
    """The kernel reads through the block table unchecked: a row past the lane's blocks is refused."""
    rng, kp, vp, blocks = _pool(3)
    q = rng.standard_normal((2, 8, 64)).astype(np.float32)
    bt = kp.shape[1]
    paged_attention(q, kp, vp, blocks[:2], 2 * bt - 2)  # the last two positions of two blocks: fine
    with pytest.raises(EngineError, match="lane 0 has 2 KV blocks of 16 tokens, positions 31..32 need 3"):
        paged_attention(q, kp, vp, blocks[:2], 2 * bt - 1)


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_half_width_pools_read_as_their_decoded_values(kind: str) -> None:
    """A half-width pool (int16 products by default) gives what a float32 pool holding its decoded values gives
    with the same products (the tiles are widened exactly), and the reference over those values, at a window
    and a softcap too."""
    rng, kp, vp, blocks = _pool(11)
    st = kvtype.storage(kind)
    kh, vh = kvtype.encode(kp, st), kvtype.encode(vp, st)
    kw, vw = kvtype.decode(kh), kvtype.decode(vh)
    q = rng.standard_normal((200, 8, 64)).astype(np.float32)
    for window, softcap in ((0, 0.0), (96, 0.0), (0, 30.0)):
        got = prefill_attention(q, kh, vh, blocks, 700, window, 0.125, softcap)
        np.testing.assert_array_equal(got, prefill_attention(q, kw, vw, blocks, 700, window, 0.125, softcap, "i16"))
        blas = prefill_attention(q, kh, vh, blocks, 700, window, 0.125, softcap, "f32")
        np.testing.assert_array_equal(blas, prefill_attention(q, kw, vw, blocks, 700, window, 0.125, softcap))
        bt, pos, table = kp.shape[1], np.arange(900), np.asarray(blocks)
        ref = reference_attention(q, kw[table[pos // bt], pos % bt], vw[table[pos // bt], pos % bt], 700, window,
                                  0.125, softcap)
        assert np.abs(blas - ref).max() < 5e-6
        assert np.abs(got - ref).max() < 1e-3


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16"])
def test_gather_rows_walks_the_block_table(kind: str) -> None:
    """gather_rows = numpy's fancy indexing through the table, decoded; from any position, over block edges,
    on a strided pool (a layer's slice of a bigger one)."""
    rng, kp, _, blocks = _pool(5, kvh=3, dim=40)
    big = kvtype.encode(np.stack([kp, kp + 1]), kvtype.storage(kind))[:, :, :, 1:]  # strided: heads 1..2 of 3
    pool = big[1]
    table = np.asarray(blocks, dtype=np.int64)
    bt = pool.shape[1]
    for k0, n in ((0, 16), (5, 40), (300, 1), (17, 512 - 17)):
        out = np.full((n, 40), np.nan, np.float32)
        gather_rows(pool, table, 1, k0, out)
        pos = np.arange(k0, k0 + n)
        np.testing.assert_array_equal(out, kvtype.decode(pool[table[pos // bt], pos % bt, 1]))


def test_positions_past_the_lanes_blocks_or_bad_ids_are_refused() -> None:
    """prefill_attention gathers through the table unchecked: the span and the ids are checked first."""
    rng, kp, vp, blocks = _pool(3)
    q = rng.standard_normal((64, 8, 64)).astype(np.float32)
    with pytest.raises(EngineError, match="lane 0 has 4 KV blocks of 16 tokens, positions 10..73 need 5"):
        prefill_attention(q, kp, vp, blocks[:4], 10)
    with pytest.raises(EngineError, match="block ids 0..80 outside the pool's 80"):
        prefill_attention(q, kp, vp, [0, 1, 2, 3, 80], 10)
