"""Sibling weights fused at load (engine/model/fuse.py): one launch for Q/K(/V) and for gate/up, the same bits
as apart, and only what can be fused is."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from engine import Session, load_model, step_batch
from engine.model.fuse import fusable, fuse, fuse_siblings, matmul_group
from engine.model.linear import matmul
from engine.model.resident import QuantWeight, resident_weight
from engine.quant.quantize import quantize_as

RNG = np.random.default_rng(5)


def _w(name: str, qtype: QT, rows: int, cols: int = 256) -> QuantWeight:
    w = RNG.standard_normal((rows, cols)).astype(np.float32)
    out = resident_weight(name, qtype, quantize_as(qtype, w), (rows, cols))
    assert isinstance(out, QuantWeight)
    return out


@pytest.mark.parametrize("lanes", [1, 3, 9])
def test_fused_products_are_the_members_products_bit_for_bit(lanes: int) -> None:
    q, k, v = _w("q", QT.Q5_0, 64), _w("k", QT.Q5_0, 32), _w("v", QT.Q5_0, 40)  # v: a padded last tile
    x = RNG.standard_normal((lanes, 256)).astype(np.float32)
    apart = [matmul(x, w) for w in (q, k, v)]
    g = fuse((q, k, v))
    assert g is not None and g.bounds == (0, 64, 96, 136) and g.whole.raw.shape[0] == 4 + 2 + 3
    assert all(w.raw.base is g.whole.raw or w.raw.base is g.whole.raw.base for w in (q, k, v))  # views, one copy
    got = matmul_group(x, (q, k, v), matmul)
    for a, b in zip(apart, got, strict=False):
        assert np.array_equal(a, b)
    for w, a in zip((q, k, v), apart, strict=False):  # a member still multiplies on its own
        assert np.array_equal(matmul(x, w), a)
    out = matmul_group(x, (k, v), matmul)  # not the group's leading member: each apart, same bits
    assert np.array_equal(out[0], apart[1]) and np.array_equal(out[1], apart[2])


def test_a_dropped_layer_is_freed_at_once() -> None:
    import gc
    import weakref

    q, k = _w("q", QT.Q5_0, 64), _w("k", QT.Q5_0, 32)
    g = fuse((q, k))
    assert g is not None
    whole = weakref.ref(g.whole)
    gc.disable()  # no cycle collection may help: plain reference counting must free it
    try:
        del q, k, g
        assert whole() is None
    finally:
        gc.enable()


def test_only_what_can_be_fused_is() -> None:
    q, k, v = _w("q", QT.Q5_0, 64), _w("k", QT.Q5_0, 32), _w("v", QT.Q8_0, 32)
    fuse_siblings((q, k, v))  # v has another layout: Q and K only
    assert q.group is not None and q.group is k.group and v.group is None
    x = RNG.standard_normal((2, 256)).astype(np.float32)
    out = matmul_group(x, (q, k, v), matmul)
    assert [o.shape for o in out] == [(2, 64), (2, 32), (2, 32)]
    assert np.array_equal(out[2], matmul(x, v))
    a, b = _w("a", QT.Q5_0, 40), _w("b", QT.Q5_0, 32)
    assert not fusable((a, b))  # a padded tile in the middle would shift b's rows
    assert not fusable((_w("c", QT.Q5_0, 32), _w("d", QT.Q5_0, 32, cols=512)))  # row lengths differ
    plain = RNG.standard_normal((32, 256)).astype(np.float32)
    assert not fusable((plain, _w("e", QT.Q5_0, 32)))
    assert not fusable((q, _w("f", QT.Q5_0, 32)))  # already in a group


def _decode_digest(model) -> str:  # type: ignore[no-untyped-def]
    """Logits of a prefill, 12 serial steps and 4 batched steps of 3 lanes, hashed."""
    h = hashlib.sha1()
    s = Session(model)
    lg = s.prefill([2, 651, 6037, 529, 9405, 563, 496, 1310] * 3)
    h.update(lg.tobytes())
    for _ in range(12):
        lg = s.step(int(np.argmax(lg)))
        h.update(lg.tobytes())
    pool = model.new_pool(None)
    lanes = [Session(model, pool) for _ in range(3)]
    ids = [int(np.argmax(x.prefill([2, 651, 6037, 529][: 2 + i]))) for i, x in enumerate(lanes)]
    for _ in range(4):
        lg = step_batch(lanes, ids)
        h.update(lg.tobytes())
        ids = [int(i) for i in np.argmax(lg, axis=1)]
    return h.hexdigest()


@pytest.mark.gemma
@pytest.mark.slow
def test_gemma_fused_and_apart_give_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    fused = load_model("gemma3-270m", resident=True, progress=False)
    lw = fused.weights.layers[0]
    assert lw.wq.group is not None and lw.wq.group is lw.wk.group and lw.w_gate.group is lw.w_up.group
    monkeypatch.setenv("FAK_FUSE", "0")
    apart = load_model("gemma3-270m", resident=True, progress=False)
    assert apart.weights.layers[0].wq.group is None
    assert fused.weights.nbytes == apart.weights.nbytes  # the members are views: nothing counted twice
    assert _decode_digest(fused) == _decode_digest(apart)
