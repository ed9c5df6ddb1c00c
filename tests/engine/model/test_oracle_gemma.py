"""Oracle: Gemma 3 270M Q4_K_M, HF transformers (float32, gguf_file=) vs our plain float32 engine."""

from __future__ import annotations

import pytest
import torch

from engine import load_model
from engine.gguf.aliases import resolve_model
from support.ggufgen import oracle_check
from support.hf_gguf import causal_lm

pytestmark = [pytest.mark.oracle, pytest.mark.gemma, pytest.mark.slow]

# Token ids until the tokenizer lands: BOS (2) + ordinary vocabulary ids.
PROMPTS = [
    [2, 818, 5279, 529, 7001, 563, 1437, 3853],
    [2, 105, 2364, 107, 3689, 563, 506, 5279, 529, 9405, 236881, 106, 107, 105, 4368, 107],
    [2, 1018, 1190, 36666, 1123, 506, 31770, 4691, 3342, 236764, 573, 13161, 10394, 236761, 108, 818, 3029, 2181,
     529, 67397, 5946, 1144, 2268, 625, 236764, 1175, 236743, 236770, 236771, 1055, 528, 506, 1811],
]


# Past the sliding window: 631 tokens, so from position 512 on the 15 sliding layers see only the
# last 512 keys.
_LONG = """
The lighthouse on the northern cape was built in 1871, after three ships were lost on the reef in a single
winter. Its keeper kept a logbook in a careful hand: the wind, the state of the sea, the ships that passed and
the hours the lamp burned. For forty years the entries changed little. A schooner bound for the south with
timber, a steamer carrying mail, a fishing fleet that left before dawn and came back at dusk with the gulls
following close behind. In the spring the keeper painted the iron railings, and in the autumn he cleaned the
great lens, a beehive of glass prisms that had come by ship from France in twelve wooden crates packed with
straw.

The village below the cape lived from the sea. There was a harbour with a stone pier, a church with a slate
roof, a school of two rooms, and a shop that sold everything from rope and paraffin to sugar and boots.
Children walked along the cliff path to school and were warned never to go near the edge when the wind came
from the west. In the evenings the men mended nets on the quay while the women smoked herring in sheds that
smelled of oak and salt. News arrived once a week with the mail boat, and the whole village gathered on the
pier to hear it.

When the railway reached the nearest town, everything began to change. Fish could now be sent to the cities in
a day, packed in ice, and the prices rose. Young people left for work in the factories and the shipyards, and
many of them never came back. The school closed its second room. The shop began to sell tinned food and
newspapers that were only a day old. The keeper, an old man by then, wrote in his logbook that the sea was the
same as it had always been, but that the people who watched it were fewer every year.

In 1923 the lamp was converted from paraffin to electricity, and a cable was laid up the hill from the new
power station by the river. The keeper's son, who had learned the work from his father, stayed on as an
assistant for another decade. He was the one who noticed that the reef was moving. Every storm shifted the
sand banks a little further to the east, and the channel that the fishing boats used grew narrower and
shallower. He drew charts by hand, measuring the depth with a weighted line from a rowing boat, and sent them
to the harbour authority in the town. Nobody answered his letters for two years.

Then, on a night of fog in November, a cargo ship ran aground on the new bank. The crew were rescued by the
village lifeboat, rowed out by eight men who had known each other since childhood. The ship broke apart over
the next week, and its cargo of oranges washed up on every beach for miles. The harbour authority sent an
engineer, who found the charts, confirmed them, and had a new buoy placed at the edge of the bank. The
keeper's son kept the letter of thanks in a frame above his desk until the day he died.
"""
LONG_TEXT = "\n\n".join(" ".join(p.split()) for p in _LONG.strip().split("\n\n"))


# max |logit diff| against HF float32: 3e-4, not the tiny models' 1e-4, because HF float32 is itself
# that far from the exact value here. Measured against HF in float64 with float64 RoPE angles (HF's
# rotary embedding computes position x inv_freq in float32 even for a float64 model): ours is within
# 5.2e-5 / 7.2e-5 / 6.6e-5 of it on PROMPTS[1], PROMPTS[2] and LONG_TEXT; HF float32 within 1.4e-4 /
# 4.9e-5 / 1.5e-4. Ours vs HF float32: 3.4e-5 / 1.6e-4 (position 1) / 9.3e-5 on PROMPTS[0..2], 1.4e-4
# on LONG_TEXT; decode steps <= 4.2e-5; hidden states within 8.4e-6 relative (ggufgen.REL_TOL holds).
LOGIT_TOL = 3e-4
LONG_LOGIT_TOL = 1e-3  # at 4,096 positions (see the test: HF's float32 RoPE angles)
# a half-width KV cache (--kv-dtype), LONG_TEXT + 8 steps: f16 moved the logits by 8.8e-3 at most (vs HF and vs our
# f32 cache alike; f32 is 5.3e-5 from HF), bf16 by 8.5e-2; no argmax moved (bench/kv_dtype.py: Qwen 2.5 0.5B)
KV_TOL = {"f16": 2e-2, "bf16": 2e-1}
# at 4,096 positions (64-row chunks; the largest of the 64 chunk ends), against our f32 cache with BLAS products:
# the f16 cache with BLAS products moved the logits by 2.10e-2 (8.8e-3 on a chunk's average), int16 attention
# products over the f32 cache by 2.12e-2 (1.0e-2), both together by 2.12e-2 (1.2e-2); no greedy choice moved
LONG_KV_TOL = 4e-2


@pytest.fixture(scope="module")
def pair():  # type: ignore[no-untyped-def]
    path = resolve_model("gemma3-270m")
    return causal_lm(path), load_model(path)


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
    figures = oracle_check(hf, model, PROMPTS[prompt], logit_tol=LOGIT_TOL)
    print(f"gemma prompt {prompt}: {figures}")


@pytest.mark.slow
def test_matches_hf_past_the_sliding_window(pair) -> None:  # type: ignore[no-untyped-def]
    """Every one of the 631 positions against HF, then 4 decode steps on both KV caches (figures at
    LOGIT_TOL; a window one position off moves these logits by ~0.5)."""
    from engine.tokenizer import load_tokenizer

    hf, model = pair
    ids = load_tokenizer("gemma3-270m").encode(LONG_TEXT)
    assert len(ids) == 631 and ids[0] == 2
    figures = oracle_check(hf, model, ids, n_decode=4, logit_tol=LOGIT_TOL)
    print(f"gemma {len(ids)} tokens: {figures}")


def test_fak_run_raw_completion_matches_hf(pair) -> None:  # type: ignore[no-untyped-def]
    """`fak run gemma3-270m --json "The capital of France is" --max-tokens 16 --temp 0`: a base model
    with no chat template gets BOS + the raw text, and the greedy ids are HF's on the same GGUF."""
    import json
    import subprocess
    import sys

    from engine.tokenizer import load_tokenizer
    from support.ggufgen import hf_greedy

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


@pytest.fixture(scope="module")
def long_ids() -> list[int]:
    """4,096 tokens: LONG_TEXT eight times over, after BOS."""
    from engine.tokenizer import load_tokenizer

    text_ids = load_tokenizer("gemma3-270m").encode(LONG_TEXT, add_special=False)
    return ([2] + text_ids * 8)[:4096]


@pytest.fixture(scope="module")
def hf_4k(pair, long_ids: list[int]):  # type: ignore[no-untyped-def]
    """HF on the whole 4k prompt at once, computed once for the module (a 4k forward is ~17 s on 2 cores):
    the logits at the last position of every 64-row chunk, and its 4 greedy tokens. One `generate` gives
    both: its first step's hidden states cover every prompt position (equal to a plain forward's)."""
    hf, _ = pair
    with torch.no_grad():
        out = hf.generate(torch.tensor([long_ids]), max_new_tokens=4, do_sample=False,
                          output_hidden_states=True, return_dict_in_generate=True)
        last = out.hidden_states[0][-1][0, 63::64]  # after the final norm, at each chunk's last position
        theirs = (last @ hf.get_output_embeddings().weight.T).float()
        if hf.config.final_logit_softcapping:
            cap = hf.config.final_logit_softcapping
            theirs = torch.tanh(theirs / cap) * cap
    return theirs.numpy(), out.sequences[0, len(long_ids):].tolist()


def _chunked(model, ids: list[int], kv: str = "f32"):  # type: ignore[no-untyped-def]
    """Our logits at each 64-row chunk's end as the scheduler prefills, then 4 greedy decode steps."""
    import numpy as np

    from engine import Session

    model.kv_dtype = kv
    try:
        s = Session(model)
        assert s.pool.kv_dtype == kv
        rows = np.stack([s.prefill(ids[i : i + 64]).copy() for i in range(0, len(ids), 64)])
        toks, logits = [], rows[-1]
        for _ in range(4):
            toks.append(int(np.argmax(logits)))
            logits = s.step(toks[-1])
        s.free()
    finally:
        model.kv_dtype = "f32"
    return rows, toks


@pytest.fixture(scope="module")
def f32_4k(pair, long_ids: list[int]):  # type: ignore[no-untyped-def]
    """Ours on the 4k prompt with an f32 cache and BLAS prefill products, shared by the two 4k tests."""
    return _chunked(pair[1], long_ids)


@pytest.mark.slow
def test_matches_hf_at_4k_positions_through_prefill_chunks(pair, long_ids, hf_4k, f32_4k) -> None:  # type: ignore[no-untyped-def]
    """A 4,096-token prompt prefilled as the scheduler does it (64-row chunks, each through the flash-style
    prefill attention over every earlier position; the 15 sliding layers see the last 512), against HF on
    the whole prompt at once: the logits at the last position of every chunk (64 positions, up to 4,095),
    then 4 greedy decode steps on our KV cache."""
    import numpy as np

    _, model = pair
    (theirs, want), (ours, toks) = hf_4k, f32_4k
    assert np.array_equal(theirs.argmax(-1), ours.argmax(-1))
    diff = np.abs(theirs - ours).max(-1)
    print(f"gemma 4096 tokens in 64-row chunks: max |logit diff| {diff.max():.2e} at chunk {int(diff.argmax())}")
    # The gap to HF grows with the position (2-5e-5 in the first chunks, 6.5e-4 at 4k): HF computes the RoPE
    # angles position x inv_freq in float32 (an error of ~position x 6e-8 rad), ours in float64. Our own two
    # attention paths, the flash prefill and the row-stable decode kernels, agree within 1.6e-4 at 4k.
    assert diff.max() <= LONG_LOGIT_TOL
    assert toks == want
    model.prefill_blas = False  # the same chunks through the decode kernels: a second, independent path
    try:
        rows, _ = _chunked(model, long_ids)
    finally:
        model.prefill_blas = True
    assert np.abs(rows - ours).max() <= LOGIT_TOL


@pytest.mark.slow
def test_an_f16_cache_at_4k_positions_with_int16_attention_products(pair, long_ids, hf_4k, f32_4k) -> None:  # type: ignore[no-untyped-def]
    """The default serving path at 4,096 positions: an f16 KV cache, so each 64-row chunk's prefill attention
    runs on int16 tiles (engine/kernels/i16tile.py). Against HF and against our f32 cache (BLAS products):
    within the f16 cache's tolerance at 4k (LONG_KV_TOL), every chunk's greedy choice the same, and HF's 4
    greedy decode steps."""
    import numpy as np

    (theirs, want), (f32, _) = hf_4k, f32_4k
    half, toks = _chunked(pair[1], long_ids, "f16")
    vs_hf, vs_f32 = np.abs(half - theirs).max(), np.abs(half - f32).max()
    print(f"gemma f16 KV + int16 attention, 4096 positions: max |logit diff| vs HF {vs_hf:.2e}, vs f32 {vs_f32:.2e}")
    assert vs_hf <= LONG_KV_TOL and vs_f32 <= LONG_KV_TOL
    assert np.array_equal(half.argmax(-1), theirs.argmax(-1)) and np.array_equal(f32.argmax(-1), theirs.argmax(-1))
    assert toks == want


@pytest.mark.slow
@pytest.mark.parametrize("kv_dtype", ["f16", "bf16"])
def test_a_half_width_kv_cache_against_hf_and_f32(pair, kv_dtype: str) -> None:  # type: ignore[no-untyped-def]
    """What `--kv-dtype f16|bf16` costs in logits: LONG_TEXT (631 positions, past the sliding window) through
    64-row chunks as the scheduler sends it, then 8 decode steps fed HF's greedy tokens; the logits at every
    chunk's last position and after each step, against HF float32 and against our float32 cache. Measured
    (bench/kv_dtype.py prints the same for any model): see KV_TOL."""
    import numpy as np

    from engine import Session
    from engine.tokenizer import load_tokenizer

    hf, model = pair
    ids = load_tokenizer("gemma3-270m").encode(LONG_TEXT)
    with torch.no_grad():
        full = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0].tolist()
        theirs = hf(torch.tensor([full])).logits[0].float().numpy()
    ends = [min(i + 64, len(ids)) - 1 for i in range(0, len(ids), 64)] + list(range(len(ids), len(full) - 1))
    theirs = theirs[ends]

    def ours(kv: str) -> np.ndarray:
        model.kv_dtype = kv
        try:
            s = Session(model)
            rows = [s.prefill(ids[i : i + 64]).copy() for i in range(0, len(ids), 64)]
            rows += [s.step(t).copy() for t in full[len(ids) : -1]]
            assert s.pool.kv_dtype == kv
            s.free()
        finally:
            model.kv_dtype = "f32"
        return np.stack(rows)

    f32, half = ours("f32"), ours(kv_dtype)
    vs_hf, vs_f32 = np.abs(half - theirs).max(), np.abs(half - f32).max()
    print(f"gemma {kv_dtype} KV, {len(ids)} positions + 8 steps: max |logit diff| vs HF {vs_hf:.2e}, "
          f"vs f32 KV {vs_f32:.2e} (f32 KV vs HF {np.abs(f32 - theirs).max():.2e})")
    assert np.abs(f32 - theirs).max() <= LOGIT_TOL
    assert vs_hf <= KV_TOL[kv_dtype] and vs_f32 <= KV_TOL[kv_dtype]
    assert np.array_equal(half.argmax(-1), theirs.argmax(-1))  # no greedy choice moved on this text
