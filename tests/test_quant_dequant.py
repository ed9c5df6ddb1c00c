"""Our vectorized dequantizers against gguf.quants.dequantize: random blocks and real Gemma tensors."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT

from engine.errors import GGUFError
from engine.quant.dequant import SUPPORTED, dequantize


def _random_blocks(qtype: QT, n_blocks: int, seed: int) -> np.ndarray:
    """Random bytes with sane f16 scales (random bits may be inf/nan, which compare badly)."""
    rng = np.random.default_rng(seed)
    _, ts = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    def put_f16(col: int) -> None:
        raw[:, col : col + 2] = rng.uniform(-2, 2, n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    if qtype in (QT.Q4_0, QT.Q5_0, QT.Q8_0):
        put_f16(0)
    elif qtype in (QT.Q4_1, QT.Q5_1, QT.Q4_K, QT.Q5_K):
        put_f16(0)
        put_f16(2)
    elif qtype == QT.Q6_K:
        put_f16(208)
    elif qtype == QT.Q8_K:
        raw[:, 0:4] = rng.uniform(-2, 2, n_blocks).astype(np.float32).view(np.uint8).reshape(-1, 4)
    return raw


@pytest.mark.parametrize("qtype", [t for t in SUPPORTED if t not in (QT.F32, QT.F16, QT.BF16, QT.Q8_K)],
                         ids=lambda t: t.name)
def test_block_types_match_gguf_reference(qtype: QT) -> None:
    bs, ts = GGML_QUANT_SIZES[qtype]
    n_blocks = 37
    raw = _random_blocks(qtype, n_blocks, seed=qtype.value)
    ours = dequantize(raw, qtype, n_blocks * bs)
    ref = quants.dequantize(raw.reshape(1, -1), qtype).reshape(-1)
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.BF16], ids=lambda t: t.name)
def test_float_types(qtype: QT) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal(100).astype(np.float32)
    if qtype == QT.F32:
        raw = x.view(np.uint8)
    elif qtype == QT.F16:
        raw = x.astype(np.float16).view(np.uint8)
    else:
        raw = (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    ref = quants.dequantize(raw.reshape(1, -1), qtype).reshape(-1)
    np.testing.assert_array_equal(dequantize(raw, qtype, 100), ref.astype(np.float32))


def test_q8_k_against_scalar_reference() -> None:
    # gguf has no Q8_K dequantizer: block = f32 d, 256 int8, 16 int16 bsums (unused here).
    raw = _random_blocks(QT.Q8_K, 5, seed=3)
    want = []
    for blk in raw:
        d = float(blk[0:4].view(np.float32)[0])
        want.extend(d * float(q) for q in blk[4:260].view(np.int8))
    np.testing.assert_allclose(dequantize(raw, QT.Q8_K, 5 * 256), want, rtol=1e-6)


def test_unsupported_type() -> None:
    with pytest.raises(GGUFError, match="IQ2_XXS"):
        dequantize(np.zeros(66, np.uint8), QT.IQ2_XXS, 256)


@pytest.mark.gemma
def test_real_gemma_tensors_match_reference() -> None:
    from engine.gguf.aliases import resolve_model
    from engine.gguf.reader import read_gguf

    g = read_gguf(resolve_model("gemma3-270m"))
    seen: set[QT] = set()
    for t in g.tensors.values():
        if t.qtype in seen or t.qtype == QT.F32:
            continue
        seen.add(t.qtype)
        rows = min(t.shape[0], 64)  # a slice of rows keeps the test fast
        raw = t.raw[:rows]
        ours = dequantize(raw, t.qtype, rows * t.shape[1])
        ref = quants.dequantize(np.asarray(raw), t.qtype).reshape(-1)
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-7, err_msg=f"{t.name} {t.qtype.name}")
    assert {QT.Q8_0, QT.Q5_0, QT.Q4_K, QT.Q6_K} <= seen
