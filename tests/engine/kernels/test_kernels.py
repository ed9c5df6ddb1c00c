"""numba kernels on quantized blocks vs a slow obvious reference (float64 gguf dequant + matmul)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize

from engine.errors import EngineError
from engine.kernels import tilegemm as T
from engine.model.resident import QuantWeight, resident_nbytes, resident_weight
from support.blocks import TYPES, random_blocks


def reference(raw: np.ndarray, qtype: QT, x: np.ndarray) -> np.ndarray:
    w = dequantize(raw, qtype).astype(np.float64)
    return x.astype(np.float64) @ w.T


SHAPES = {QT.Q8_0: (37, 96), QT.Q5_0: (41, 160), QT.Q4_K: (23, 512), QT.Q6_K: (19, 768)}


@pytest.fixture(scope="module", params=TYPES, ids=lambda t: t.name)
def weight(request: pytest.FixtureRequest) -> tuple[QT, np.ndarray, QuantWeight]:
    qtype = request.param
    rows, cols = SHAPES[qtype]
    raw = random_blocks(qtype, rows, cols, seed=int(qtype))
    w = resident_weight(f"t.{qtype.name}", qtype, raw, (rows, cols))
    assert isinstance(w, QuantWeight) and w.shape == (rows, cols) and w.qtype == qtype
    return qtype, raw, w


@pytest.mark.parametrize("B", [1, 3, 16])
def test_matmul_matches_float64_reference(weight: tuple[QT, np.ndarray, QuantWeight], B: int) -> None:
    qtype, raw, w = weight
    x = np.random.default_rng(B).standard_normal((B, w.shape[1])).astype(np.float32)
    got = w.matmul(x)
    ref = reference(raw, qtype, x)
    scale = np.abs(dequantize(raw, qtype)).astype(np.float64) @ np.abs(x.T).astype(np.float64)
    assert got.shape == (B, w.shape[0]) and got.dtype == np.float32
    tol = 2e-6 * scale.T + 1e-6
    if w.layout.endswith("x16"):
        # int16 activations (engine/kernels/tiledot.py): exact to float rounding against the quantized x,
        # and within half a step per value (dx / 2 = max|x_block| / 65534) of the float x
        xq, dx = np.empty(x.shape, np.int16), np.empty((B, x.shape[1] // 32), np.float32)
        T.quantize_rows_i16(x, xq, dx, np.empty_like(dx))
        xhat = (xq.reshape(B, -1, 32) * dx[:, :, None].astype(np.float64)).reshape(x.shape)
        # round to nearest, x / dx taken in float32: up to 32767 * 2^-24 of a step more than half
        assert np.all(np.abs(xhat - x).reshape(B, -1, 32).max(axis=2) <= dx * 0.504)
        assert np.all(np.abs(got - reference(raw, qtype, xhat)) <= tol)
        wabs = np.abs(dequantize(raw, qtype)).astype(np.float64).reshape(w.shape[0], -1, 32).sum(axis=2)
        tol = tol + (dx.astype(np.float64) * 0.504) @ wabs.T
    assert np.all(np.abs(got - ref) <= tol)


def test_rows_bit_identical_across_batch_sizes(weight: tuple[QT, np.ndarray, QuantWeight]) -> None:
    _, _, w = weight
    x = np.random.default_rng(7).standard_normal((16, w.shape[1])).astype(np.float32)
    full = w.matmul(x)
    for b in range(16):
        assert np.array_equal(w.matmul(x[b : b + 1])[0], full[b])
    assert np.array_equal(w.matmul(x[5:8]), full[5:8])
    assert np.array_equal(w.matmul(x[3]), full[3])  # 1-D activation


def test_dequantize_and_take_match_gguf(weight: tuple[QT, np.ndarray, QuantWeight]) -> None:
    qtype, raw, w = weight
    ref = dequantize(raw, qtype)
    np.testing.assert_allclose(w.dequantize(), ref, rtol=1e-6, atol=1e-7)
    ids = [w.shape[0] - 1, 0, 2, 2]
    np.testing.assert_allclose(w.take(ids), ref[ids], rtol=1e-6, atol=1e-7)
    with pytest.raises(EngineError, match="out of range"):
        w.take([w.shape[0]])


@pytest.mark.parametrize("T", [3, 40])
def test_matmul_prefill_matches_reference(weight: tuple[QT, np.ndarray, QuantWeight], T: int) -> None:
    qtype, raw, w = weight
    x = np.random.default_rng(T).standard_normal((T, w.shape[1])).astype(np.float32)
    ref = reference(raw, qtype, x)
    np.testing.assert_allclose(w.matmul_prefill(x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_nbytes_is_the_block_bytes(weight: tuple[QT, np.ndarray, QuantWeight]) -> None:
    qtype, raw, w = weight
    # 16-row tiles (the last one padded with zero rows) of the GGUF's bytes per row, except Q4_K,
    # whose packed 6-bit scales and mins are kept one byte each (148 bytes per 256 values, not 144)
    assert w.layout == qtype.name + "x16"
    row = raw.nbytes // w.shape[0] // 144 * 148 if qtype == QT.Q4_K else raw.nbytes // w.shape[0]
    assert w.nbytes == row * -(-w.shape[0] // 16) * 16
    assert w.nbytes == resident_nbytes(qtype.name, *w.shape)  # what q4kdiag's header-only plan counts


def test_dense_types_become_float32_arrays() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((5, 8)).astype(np.float32)
    got = resident_weight("d.f32", QT.F32, a.view(np.uint8), (5, 8))
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and np.array_equal(got, a)
    h = a.astype(np.float16)
    np.testing.assert_array_equal(resident_weight("d.f16", QT.F16, h.view(np.uint8), (5, 8)), h.astype(np.float32))
    bf = (a.view(np.uint32) >> 16).astype(np.uint16)
    got = resident_weight("d.bf16", QT.BF16, bf.view(np.uint8), (5, 8))
    np.testing.assert_array_equal(got, (bf.astype(np.uint32) << 16).view(np.float32))


def test_bad_input_is_one_clear_error() -> None:
    raw = random_blocks(QT.Q8_0, 4, 64)
    with pytest.raises(EngineError, match="blk.0.x: Q8_0 data is"):
        resident_weight("blk.0.x", QT.Q8_0, raw[:3], (4, 64))
    with pytest.raises(EngineError, match="not a multiple of 256"):
        resident_weight("blk.0.y", QT.Q4_K, raw, (4, 100))
    with pytest.raises(EngineError, match="'blk.0.z' is Q2_K, which has no resident kernel.*run with --plain"):
        resident_weight("blk.0.z", QT.Q2_K, raw, (4, 64))
    w = resident_weight("blk.0.x", QT.Q8_0, raw, (4, 64))
    with pytest.raises(EngineError, match="activation shape"):
        w.matmul(np.zeros((1, 63), np.float32))


@pytest.mark.gemma
def test_real_gemma_tensors_match_reference() -> None:
    from engine.gguf.aliases import resolve_model
    from engine.gguf.reader import read_gguf

    g = read_gguf(resolve_model("gemma3-270m"))
    names = ["blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.attn_output.weight", "blk.0.ffn_down.weight"]
    seen = set()
    for name in names:
        t = g.tensors[name]
        w = resident_weight(name, t.qtype, t.raw, (int(t.shape[0]), int(t.shape[1])))
        seen.add(t.qtype)
        x = np.random.default_rng(0).standard_normal((2, w.shape[1])).astype(np.float32)
        ref = reference(np.asarray(t.raw), t.qtype, x)
        np.testing.assert_allclose(w.matmul(x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    assert seen == set(TYPES)


def test_matmul_prefill_split_over_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.model.resident as R

    monkeypatch.setattr(R, "_TILE_BYTES", 64 * 4 * 96)  # 64-row tiles: 300 rows -> several tiles, both workers
    raw = random_blocks(QT.Q8_0, 300, 96, seed=4)
    w = resident_weight("t.split", QT.Q8_0, raw, (300, 96))
    x = np.random.default_rng(2).standard_normal((20, 96)).astype(np.float32)
    ref = reference(raw, QT.Q8_0, x)
    np.testing.assert_allclose(w.matmul_prefill(x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
