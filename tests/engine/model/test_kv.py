"""BlockPool / PageTable behaviour and swap serialisation (export_blocks / import_blocks)."""

import numpy as np
import pytest

from engine.errors import EngineError
from engine.model.kv import BlockPool, KVExhausted, PageTable, export_blocks, import_blocks


def _pool(n: int | None = 6, bt: int = 4, kv_dtype: str = "f32") -> BlockPool:
    return BlockPool(n_layers=2, n_kv_heads=2, head_dim=3, num_blocks=n, block_tokens=bt, kv_dtype=kv_dtype)


def _fill(pt: PageTable, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    pt.reserve(n)
    written = []
    for layer in range(pt.pool.n_layers):
        k = rng.standard_normal((n, 2, 3)).astype(np.float32)
        v = rng.standard_normal((n, 2, 3)).astype(np.float32)
        pt.write(layer, 0, k, v)
        written.append((k, v))
    pt.length = n
    return written


def test_fixed_pool_exhausts_and_refcounts() -> None:
    pool = _pool(3)
    a, b, c = pool.allocate(), pool.allocate(), pool.allocate()
    assert (a, b, c) == (0, 1, 2) and pool.num_free == 0
    with pytest.raises(KVExhausted):
        pool.allocate()
    pool.incref(b)
    assert not pool.release(b) and pool.release(b) and pool.num_free == 1
    with pytest.raises(EngineError):
        pool.release(b)


def test_page_table_write_gather_across_blocks() -> None:
    rng = np.random.default_rng(0)
    pt = PageTable(_pool(None))
    written = _fill(pt, 11, rng)
    assert len(pt.blocks) == 3
    for layer, (k, v) in enumerate(written):
        gk, gv = pt.gather(layer, 11)
        np.testing.assert_array_equal(gk, k)
        np.testing.assert_array_equal(gv, v)


@pytest.mark.parametrize("kv_dtype,nbytes", [("f16", 2), ("bf16", 2)])
def test_a_half_width_pool_stores_rounded_values_in_half_the_bytes(kv_dtype: str, nbytes: int) -> None:
    from engine.kernels import kvtype

    rng = np.random.default_rng(2)
    pool = _pool(None, kv_dtype=kv_dtype)
    assert pool.kv_dtype == kv_dtype and pool.k.itemsize == nbytes
    assert pool.block_bytes * 2 == _pool(None).block_bytes
    pt = PageTable(pool)
    written = _fill(pt, 11, rng)
    for layer, (k, v) in enumerate(written):
        gk, gv = pt.gather(layer, 11)
        assert gk.dtype == np.float32
        np.testing.assert_array_equal(gk, kvtype.decode(kvtype.encode(k, pool.k.dtype)))
        np.testing.assert_array_equal(gv, kvtype.decode(kvtype.encode(v, pool.v.dtype)))
        np.testing.assert_allclose(gk, k, rtol=2.0 ** -7, atol=0)
    with pytest.raises(EngineError, match="unknown KV dtype"):
        _pool(kv_dtype="f64")


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_swap_roundtrip_is_bit_exact_into_different_blocks(kv_dtype: str) -> None:
    rng = np.random.default_rng(1)
    pool = _pool(8, kv_dtype=kv_dtype)
    pt = PageTable(pool)
    written = _fill(pt, 10, rng)
    before = [pt.gather(layer, 10) for layer in range(pool.n_layers)]
    other = PageTable(pool)
    other.reserve(16)  # 4 blocks: occupy low ids so the restore lands elsewhere
    data = export_blocks(pool, pt.blocks)
    assert len(data) == 3 * pool.block_bytes
    old = list(pt.blocks)
    pt.free()
    assert pool.num_free == 4
    new = import_blocks(pool, data)
    assert len(new) == 3 and new != old and all(pool.refcount[b] == 1 for b in new)
    pt.blocks, pt.length = new, 10
    for layer in range(pool.n_layers):
        gk, gv = pt.gather(layer, 10)
        np.testing.assert_array_equal(gk, before[layer][0])  # moved without a change
        np.testing.assert_array_equal(gv, before[layer][1])
        k, v = written[layer]
        assert np.array_equal(gk, k) == (kv_dtype == "f32")  # f16: rounded once, on the way in


def test_import_is_all_or_nothing_and_rejects_bad_payload() -> None:
    pool = _pool(4)
    pt = PageTable(pool)
    _fill(pt, 12, np.random.default_rng(2))
    data = export_blocks(pool, pt.blocks)
    with pytest.raises(KVExhausted):
        import_blocks(pool, data)  # 3 blocks needed, 1 free
    assert pool.num_free == 1
    with pytest.raises(EngineError, match="whole number"):
        import_blocks(pool, data[:-4])


@pytest.mark.parametrize("blocks, block_tokens", [(10**20, 16), (8, 10**23), (10**8, 16)])
def test_a_pool_larger_than_the_machine_is_a_clear_error(blocks: int, block_tokens: int) -> None:
    with pytest.raises(EngineError, match=f"KV pool of {blocks} blocks x {block_tokens} tokens needs .* GiB, more than"):
        BlockPool(18, 1, 256, num_blocks=blocks, block_tokens=block_tokens)
