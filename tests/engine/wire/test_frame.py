"""KV transfer frames: export/import round trips bit for bit, and every damaged or foreign frame is refused
with the receiving pool untouched."""

from __future__ import annotations

import numpy as np
import pytest

from engine import Session
from engine.errors import EngineError
from engine.model.kv import BlockPool
from engine.model.synthetic import synthetic_model
from engine.sched.prefix_cache import chain_hashes
from engine.wire import (
    Descriptor,
    FrameError,
    KVLayout,
    decode_frame,
    export_blocks,
    import_blocks,
)
from engine.wire.frame import CHECKSUM_BYTES, HEADER_BYTES, seal_frame
from support.sched_helpers import model, rand_prompt

BT = 16
DESC = Descriptor(scope="tenant-a", taint=False, verdict="allow")


def _pool(n: int, kv_dtype: str = "f32") -> BlockPool:
    c = model().config
    return BlockPool(c.n_layers, c.n_kv_heads, c.head_dim, n, block_tokens=BT, kv_dtype=kv_dtype)


def _prefilled(n_tokens: int, seed: int = 0, kv_dtype: str = "f32") -> tuple[Session, list[int], np.ndarray]:
    m = model()
    s = Session(m, _pool(64, kv_dtype))
    prompt = rand_prompt(np.random.default_rng(seed), n_tokens)
    logits = s.prefill(prompt)
    return s, prompt, logits


def _export(s: Session, key: bytes = b"", desc: Descriptor = DESC) -> bytearray:
    nb = len(s.kv.blocks)
    fill = s.length - (nb - 1) * BT
    return export_blocks(s.pool, s.kv.blocks, chain_hashes(s.tokens, BT, nb), [i * BT for i in range(nb)],
                         desc, model().identity, last_fill=fill, key=key)


def _snapshot(pool: BlockPool) -> tuple[int, bytes, bytes, bytes]:
    return pool.num_free, pool.k.tobytes(), pool.v.tobytes(), pool.refcount.tobytes()


def test_identity_names_the_model() -> None:
    a, b = synthetic_model(), synthetic_model(seed=1)
    assert len(a.identity) == 32 and a.identity == synthetic_model().identity
    assert a.identity != b.identity != model().identity  # another seed, another head: other identities


@pytest.mark.parametrize("kv_dtype", ["f32", "f16", "bf16"])
def test_round_trip_bit_identical_and_decodes_the_same(kv_dtype: str) -> None:
    src, prompt, logits = _prefilled(40, kv_dtype=kv_dtype)  # 3 blocks, the last one holding 8 positions
    frame = _export(src)
    dst_pool = _pool(64, kv_dtype)
    taken = [dst_pool.allocate() for _ in range(5)]  # the receiver's ids differ from the sender's
    blocks = import_blocks(dst_pool, frame, model().identity)
    assert len(blocks) == 3 and not set(blocks) & set(taken)
    for a, b in zip(src.kv.blocks, blocks, strict=False):
        assert np.array_equal(src.pool.k[:, a], dst_pool.k[:, b]) and np.array_equal(src.pool.v[:, a], dst_pool.v[:, b])
        assert dst_pool.refcount[b] == 1
    f = decode_frame(frame, model().identity, KVLayout.of(dst_pool))
    assert f.layout.dtype == {"f32": "<f4", "f16": "<f2", "bf16": "bf16"}[kv_dtype] and f.k.dtype == dst_pool.k.dtype
    assert f.layout.kv_bytes(3) == 3 * dst_pool.block_bytes // 2 == 3 * _pool(1).block_bytes // (2 if kv_dtype == "f32" else 4)
    assert f.hashes.tolist() == chain_hashes(prompt, BT, 3) and f.positions.tolist() == [0, 16, 32]
    assert f.last_fill == 8 and f.descriptor == DESC

    dst = Session(model(), dst_pool)  # a decode side built on the imported blocks + the prefill's logits
    dst.kv.blocks, dst.kv.length, dst.tokens = blocks, src.length, list(prompt)
    tok_a = tok_b = int(np.argmax(logits))
    out_a, out_b = [tok_a], [tok_b]
    for _ in range(12):
        tok_a, tok_b = int(np.argmax(src.step(tok_a))), int(np.argmax(dst.step(tok_b)))
        out_a.append(tok_a)
        out_b.append(tok_b)
    assert out_a == out_b


def test_every_byte_flip_truncation_and_trailer_is_refused() -> None:
    src, _, _ = _prefilled(40)
    frame = bytes(_export(src))
    pool = model().new_pool(16, block_tokens=BT)
    before = _snapshot(pool)
    n = len(frame)
    # every header and metadata byte, then a stride through K/V and the checksum itself
    spots = sorted(set(range(min(n, 1024))) | set(range(1024, n, 997)) | set(range(n - CHECKSUM_BYTES, n)))
    for i in spots:
        bad = bytearray(frame)
        bad[i] ^= 0x40
        with pytest.raises(FrameError):
            import_blocks(pool, bad, model().identity)
    for cut in (0, 3, HEADER_BYTES - 1, HEADER_BYTES + 5, n // 2, n - 1):
        with pytest.raises(FrameError, match="truncated"):
            import_blocks(pool, frame[:cut], model().identity)
    with pytest.raises(FrameError, match="trailing"):
        import_blocks(pool, frame + b"\0", model().identity)
    assert _snapshot(pool) == before


def test_foreign_model_and_layout_are_refused() -> None:
    src, _, _ = _prefilled(40)
    frame = _export(src)
    c = model().config
    with pytest.raises(FrameError, match="another model"):
        import_blocks(model().new_pool(16, block_tokens=BT), frame, synthetic_model().identity)
    for pool, what in [(BlockPool(c.n_layers, c.n_kv_heads, c.head_dim, 16, block_tokens=32), "block_tokens 16 vs 32"),
                       (BlockPool(c.n_layers + 1, c.n_kv_heads, c.head_dim, 16, block_tokens=BT), "n_layers 3 vs 4"),
                       (BlockPool(c.n_layers, 4, c.head_dim, 16, block_tokens=BT), "n_kv_heads 2 vs 4"),
                       (BlockPool(c.n_layers, c.n_kv_heads, 8, 16, block_tokens=BT), "head_dim 16 vs 8"),
                       (_pool(16, "f16"), "dtype <f4 vs <f2"), (_pool(16, "bf16"), "dtype <f4 vs bf16")]:
        before = _snapshot(pool)
        with pytest.raises(FrameError, match=what):
            import_blocks(pool, frame, model().identity)
        assert _snapshot(pool) == before


def test_edited_descriptor_is_refused_even_when_rechecksummed() -> None:
    src, _, _ = _prefilled(20)
    frame = _export(src, key=b"cluster-secret")
    i = frame.index(b'"taint":false')
    edited = bytearray(frame)
    edited[i : i + 13] = b'"taint":fals3'
    with pytest.raises(FrameError, match="checksum"):
        import_blocks(model().new_pool(8, block_tokens=BT), edited, model().identity, key=b"cluster-secret")
    seal_frame(edited)  # a forger recomputes the (unkeyed) checksum: the keyed seal still refuses it
    with pytest.raises(FrameError, match="descriptor seal"):
        import_blocks(model().new_pool(8, block_tokens=BT), edited, model().identity, key=b"cluster-secret")
    with pytest.raises(FrameError, match="descriptor seal"):  # the right bytes, the wrong key
        import_blocks(model().new_pool(8, block_tokens=BT), frame, model().identity, key=b"other")
    assert issubclass(FrameError, EngineError)


def test_export_checks_its_inputs() -> None:
    src, _, _ = _prefilled(20)
    with pytest.raises(FrameError, match="hashes"):
        export_blocks(src.pool, src.kv.blocks, [1], [0, 16], DESC, model().identity)
    with pytest.raises(FrameError, match="live blocks"):
        export_blocks(src.pool, [60], [1], [0], DESC, model().identity)


def test_scattered_blocks_and_a_reused_out_buffer() -> None:
    m = model()
    src = m.new_pool(16, block_tokens=BT)
    for _ in range(12):
        src.allocate()
    src.k[...] = np.random.default_rng(3).standard_normal(src.k.shape)
    src.v[...] = np.random.default_rng(4).standard_normal(src.v.shape)
    ids = [5, 2, 3, 9, 10, 0]  # runs of 1, 2 and 2 blocks, out of order
    out = bytearray(1 << 20)
    frame = export_blocks(src, ids, list(range(6)), [i * BT for i in range(6)], DESC, m.identity, out=out)
    assert isinstance(frame, memoryview) and frame.obj is out  # built in place, no allocation
    dst = m.new_pool(16, block_tokens=BT)
    held = [dst.allocate() for _ in range(8)]
    for b in (1, 4, 6):  # holes in the free list: the imported ids are not consecutive either
        dst.release(held[b])
    got = import_blocks(dst, frame, m.identity)
    assert got[:3] == [6, 4, 1]  # LIFO free list
    for a, b in zip(ids, got, strict=False):
        assert np.array_equal(src.k[:, a], dst.k[:, b]) and np.array_equal(src.v[:, a], dst.v[:, b])
