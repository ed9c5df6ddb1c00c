"""Oracle: tiny random llama / qwen2 / qwen3 / gemma3 models -> GGUF -> HF transformers (float32) vs our engine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine import load_model
from engine.gguf.config import ROPE_NEOX, ROPE_NORM
from engine.model.forward import Model
from support.ggufgen import oracle_check, random_hf_model, write_gguf
from support.hf_gguf import causal_lm

pytestmark = pytest.mark.oracle

PROMPTS = [[1, 5, 9, 200, 17], [3, 77, 77, 140, 9, 250, 31, 8, 8, 300, 12, 64, 5, 19], list(range(20, 320, 7))]


ARCHS = ["llama", "qwen2", "qwen3", "gemma3"]
_ORIGINALS: dict[str, torch.nn.Module] = {}  # arch -> the random HF model the GGUF was written from


@pytest.fixture(scope="module", params=ARCHS)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    arch = request.param
    d: Path = tmp_path_factory.mktemp(arch)
    # llama matrices as F16 (the F16 path), qwen as F32
    _ORIGINALS[arch] = random_hf_model(arch, seed=7)
    write_gguf(_ORIGINALS[arch], arch, d / "tiny.gguf", np.float16 if arch == "llama" else np.float32)
    hf = causal_lm(d / "tiny.gguf")
    return arch, hf, load_model(str(d / "tiny.gguf")), d / "tiny.gguf"


def test_gguf_written_by_ggufgen_reads_back_as_the_original(pair) -> None:  # type: ignore[no-untyped-def]
    """Pins tests/support/ggufgen.py: HF re-reading the GGUF it wrote gets the random model it started from,
    tensor for tensor (names, the llama q/k permutation, gemma's 1 + w norms), and the same logits
    (so the metadata too: RoPE bases, eps, window), so the oracle compares against the model we meant.
    Up to the writer's roundings: llama's matrices went through F16, gemma's norms through 1 + w."""
    import copy

    arch, hf, _, _ = pair
    orig = _ORIGINALS[arch]
    want = {}
    for name, t in orig.state_dict().items():
        if arch == "llama" and t.ndim == 2:
            t = t.half().float()
        elif arch == "gemma3" and name.endswith("norm.weight"):
            t = (t + 1.0) - 1.0
        want[name] = t
    back = hf.state_dict()
    assert set(back) == set(want)
    for name, t in want.items():
        assert torch.equal(back[name], t), name
    ref = copy.deepcopy(orig)
    ref.load_state_dict(want)
    ids = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        assert torch.equal(hf(ids).logits, ref(ids).logits)


@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
def test_matches_hf(pair, prompt: int) -> None:  # type: ignore[no-untyped-def]
    arch, hf, model, _ = pair
    assert model.config.arch == arch
    oracle_check(hf, model, PROMPTS[prompt])


def test_config_from_metadata(pair) -> None:  # type: ignore[no-untyped-def]
    arch, hf, model, _ = pair
    c = model.config
    want = {"llama": (False, False), "qwen2": (True, False), "qwen3": (False, True), "gemma3": (False, True)}
    assert (c.qkv_bias, c.qk_norm) == want[arch]
    assert c.tied_embeddings == (arch in ("qwen3", "gemma3"))
    if arch == "gemma3":  # the third prompt (43 tokens) runs past the window of 8
        assert [c.window(i) for i in range(6)] == [8, 8, 8, 8, 8, 0]
        assert [c.is_sliding(i) for i in range(6)] == [t == "sliding_attention" for t in hf.config.layer_types]
    assert c.head_dim == (getattr(hf.config, "head_dim", None) or 16) and c.n_kv_heads == hf.config.num_key_value_heads


def test_wrong_rope_pairing_is_caught(pair) -> None:  # type: ignore[no-untyped-def]
    # Negative control: the oracle notices the other RoPE pairing (llama GGUF is permuted for NORM).
    arch, hf, model, _ = pair
    other = ROPE_NORM if model.config.rope_style == ROPE_NEOX else ROPE_NEOX
    wrong = Model(model.config.with_(rope_style=other), model.weights)
    with pytest.raises(AssertionError, match="cosine|relative|argmax|logit|greedy"):
        oracle_check(hf, wrong, PROMPTS[2])


@pytest.mark.parametrize("pair", ["gemma3"], indirect=True)
def test_sliding_window_is_exercised(pair) -> None:  # type: ignore[no-untyped-def]
    # Negative control for gemma3 (the one arch with a window): ignoring the window, a window one
    # position off, or the wrong local RoPE base must each be caught.
    arch, hf, model, _ = pair
    assert arch == "gemma3"
    c = model.config
    for wrong_cfg in (c.with_(sliding_window=0), c.with_(sliding_window=c.sliding_window + 1),
                      c.with_(sliding_window=c.sliding_window - 1), c.with_(rope_base_local=None)):
        with pytest.raises(AssertionError):
            oracle_check(hf, Model(wrong_cfg, model.weights), PROMPTS[2])
