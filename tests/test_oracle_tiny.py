"""Oracle: tiny random llama / qwen2 / qwen3 / gemma3 models -> GGUF -> HF transformers (float32) vs our engine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from engine import load_model
from engine.gguf.config import ROPE_NEOX, ROPE_NORM
from engine.model.forward import Model
from ggufgen import oracle_check, random_hf_model, write_gguf

pytestmark = pytest.mark.oracle

PROMPTS = [[1, 5, 9, 200, 17], [3, 77, 77, 140, 9, 250, 31, 8, 8, 300, 12, 64, 5, 19], list(range(20, 320, 7))]


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "gemma3"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    arch = request.param
    d: Path = tmp_path_factory.mktemp(arch)
    # llama matrices as F16 (the F16 path), qwen as F32
    write_gguf(random_hf_model(arch, seed=7), arch, d / "tiny.gguf", np.float16 if arch == "llama" else np.float32)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(d), gguf_file="tiny.gguf", dtype=torch.float32).eval()
    return arch, hf, load_model(str(d / "tiny.gguf")), d / "tiny.gguf"


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
    with pytest.raises(AssertionError, match="cosine|argmax|greedy"):
        oracle_check(hf, wrong, PROMPTS[2])


def test_sliding_window_is_exercised(pair) -> None:  # type: ignore[no-untyped-def]
    # Negative control for gemma3: ignoring the window (or the local RoPE base) must be caught.
    arch, hf, model, _ = pair
    if arch != "gemma3":
        pytest.skip("sliding window: gemma3 only")
    for wrong_cfg in (model.config.with_(sliding_window=0), model.config.with_(rope_base_local=None)):
        with pytest.raises(AssertionError):
            oracle_check(hf, Model(wrong_cfg, model.weights), PROMPTS[2])
