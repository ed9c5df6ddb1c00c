"""Our vectorized dequantizers against gguf.quants.dequantize: random blocks and real Gemma tensors."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as QT

from engine.errors import GGUFError
from engine.quant.dequant import SUPPORTED, dequantize
from support.blocks import random_raw_blocks

# where each type keeps its f16 scales (byte offsets in a block): random bits there may be inf/nan
# every block type gguf-py can dequantize (its own list), float types aside
GGUF_BLOCK_TYPES = [t for t in quants._type_traits if t not in (QT.F32, QT.F16, QT.BF16)]


@pytest.mark.parametrize("qtype", GGUF_BLOCK_TYPES, ids=lambda t: t.name)
def test_block_types_match_gguf_reference_bit_for_bit(qtype: QT) -> None:
    assert qtype in SUPPORTED
    bs, ts = GGML_QUANT_SIZES[qtype]
    n_blocks = 37
    raw = random_raw_blocks(qtype, n_blocks, seed=qtype.value)
    ours = dequantize(raw, qtype, n_blocks * bs)
    ref = quants.dequantize(raw.reshape(1, -1), qtype).reshape(-1)
    assert ours.dtype == np.float32 and np.isfinite(ref).all() and np.abs(ref).max() > 0
    assert np.array_equal(ours, ref.astype(np.float32))


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
    raw = random_raw_blocks(QT.Q8_K, 5, seed=3)
    want = []
    for blk in raw:
        d = float(blk[0:4].view(np.float32)[0])
        want.extend(d * float(q) for q in blk[4:260].view(np.int8))
    np.testing.assert_allclose(dequantize(raw, QT.Q8_K, 5 * 256), want, rtol=1e-6)


def test_unsupported_type() -> None:
    with pytest.raises(GGUFError, match="Q8_1"):  # gguf-py has no Q8_1 dequantizer either
        dequantize(np.zeros(40, np.uint8), QT.Q8_1, 32)


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
