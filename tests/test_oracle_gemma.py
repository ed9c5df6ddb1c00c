"""Oracle: Gemma 3 270M Q4_K_M, HF transformers (float32, gguf_file=) vs our plain float32 engine."""

from __future__ import annotations

import pytest
import torch
import transformers

from engine import load_model
from engine.gguf.aliases import resolve_model
from ggufgen import oracle_check

pytestmark = [pytest.mark.oracle, pytest.mark.gemma]

# Token ids until the tokenizer lands: BOS (2) + ordinary vocabulary ids.
PROMPTS = [
    [2, 818, 5279, 529, 7001, 563, 1437, 3853],
    [2, 105, 2364, 107, 3689, 563, 506, 5279, 529, 9405, 236881, 106, 107, 105, 4368, 107],
    [2, 1018, 1190, 36666, 1123, 506, 31770, 4691, 3342, 236764, 573, 13161, 10394, 236761, 108, 818, 3029, 2181,
     529, 67397, 5946, 1144, 2268, 625, 236764, 1175, 236743, 236770, 236771, 1055, 528, 506, 1811],
]


@pytest.fixture(scope="module")
def pair():  # type: ignore[no-untyped-def]
    path = resolve_model("gemma3-270m")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    return hf, load_model(path)


def test_config(pair) -> None:  # type: ignore[no-untyped-def]
    hf, model = pair
    c = model.config
    assert (c.arch, c.n_layers, c.hidden, c.head_dim, c.n_kv_heads, c.sliding_window) == ("gemma3", 18, 640, 256, 1, 512)
    assert [c.is_sliding(i) for i in range(18)] == [t == "sliding_attention" for t in hf.config.layer_types]
    assert c.scale == pytest.approx(hf.config.query_pre_attn_scalar ** -0.5)
    assert c.tied_embeddings


@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
def test_matches_hf(pair, prompt: int) -> None:  # type: ignore[no-untyped-def]
    hf, model = pair
    figures = oracle_check(hf, model, PROMPTS[prompt])
    print(f"gemma prompt {prompt}: {figures}")


def test_fak_run_raw_completion_matches_hf(pair) -> None:  # type: ignore[no-untyped-def]
    """`fak run gemma3-270m --json "The capital of France is" --max-tokens 16 --temp 0`: a base model
    with no chat template gets BOS + the raw text, and the greedy ids are HF's on the same GGUF."""
    import json
    import subprocess
    import sys

    from engine.tokenizer import load_tokenizer
    from ggufgen import hf_greedy

    hf, _ = pair
    text = "The capital of France is"
    r = subprocess.run([sys.executable, "-m", "commands.main", "run", "gemma3-270m", "--json", text,
                        "--max-tokens", "16", "--temp", "0"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    tok = load_tokenizer("gemma3-270m")
    assert not tok.has_chat_template  # the packaged base model carries none
    assert out["prompt_ids"] == [tok.bos_id] + tok.encode(text, add_special=False) == PROMPTS[0][:6]
    want = hf_greedy(hf, out["prompt_ids"], 16)
    got = out["generated_ids"]
    assert got == want[: len(got)] and (len(got) == 16 or want[len(got)] in tok.eos_ids), (got, want)
    assert "Paris" in out["text"] or "capital" in out["text"]
