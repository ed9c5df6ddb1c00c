"""Oracle for the architectures beyond llama/qwen/gemma3 (issue 19 item 2): mistral (written as llama, a
sliding window in its metadata), granite (embedding / residual / attention / logit multipliers), gemma2
(attention and final softcaps, alternating window), phi3 (fused attn_qkv and gate/up, split at load),
olmo2 (post-norms only, q/k norm over the whole projection), qwen3moe and olmoe (router top-k over 8 experts,
renormalised or not),
smollm3 (llama with no RoPE on every 4th layer).

Each: a tiny random HF transformers model -> GGUF (tests/support/ggufgen.py, tensor names from the gguf package's
per-arch map) -> fak, against the HF model it was written from (float32 both sides): cosine >= 0.9999
per layer, argmax at every position, 16 greedy tokens (tests/ggufgen.oracle_check). transformers has a
GGUF reader for phi3 and gemma2 (and llama, for the Mistral file) but not granite/olmo2, so where it has one
it also reads our file back (pins the writer: names, q/k permutation, qkv and gate/up order). A negative control per
architecture turns each of its config fields off and must be caught.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from engine import BatchSession, load_model
from engine.errors import GGUFError
from engine.gguf.config import ModelConfig
from engine.model.forward import Model
from engine.quant.quantize import quantize_as
from support.agree import agree, serial_steps
from support.ggufgen import oracle_check, random_hf_model, write_gguf
from support.hf_gguf import causal_lm

pytestmark = pytest.mark.oracle

# the third prompt (43 tokens) runs far past every window (8)
PROMPTS = [[1, 5, 9, 200, 17], [3, 77, 77, 140, 9, 250, 31, 8, 8, 300, 12, 64, 5, 19], list(range(20, 320, 7))]
ARCHS = ["mistral", "granite", "gemma2", "phi3", "olmo2", "qwen3moe", "olmoe", "smollm3"]
# transformers' own GGUF reader knows these (a llama-arch Mistral file it reads as LlamaForCausalLM)
HF_READS_GGUF = {"mistral": "LlamaForCausalLM", "gemma2": "Gemma2ForCausalLM", "phi3": "Phi3ForCausalLM",
                 "qwen3moe": "Qwen3MoeForCausalLM"}


@pytest.fixture(scope="module", params=ARCHS)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    arch = request.param
    d: Path = tmp_path_factory.mktemp(arch)
    hf = random_hf_model(arch, seed=7)
    write_gguf(hf, arch, d / "tiny.gguf")
    return arch, hf, load_model(str(d / "tiny.gguf")), d / "tiny.gguf"


@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
def test_matches_hf(pair, prompt: int) -> None:  # type: ignore[no-untyped-def]
    arch, hf, model, _ = pair
    figures = oracle_check(hf, model, PROMPTS[prompt])
    assert figures["min_cos"] >= 0.9999 and len(figures["greedy"]) == 16  # type: ignore[arg-type]


def test_config_from_metadata(pair) -> None:  # type: ignore[no-untyped-def]
    arch, hf, model, _ = pair
    c, h = model.config, hf.config
    assert c.arch == ("llama" if arch == "mistral" else arch)
    if arch in ("qwen3moe", "olmoe"):
        width = h.moe_intermediate_size if arch == "qwen3moe" else h.intermediate_size
        assert (c.n_experts, c.n_experts_used, c.expert_ffn, c.expert_weights_norm) == (
            h.num_experts, h.num_experts_per_tok, width, h.norm_topk_prob) == (8, 2, 32, arch == "qwen3moe")
        assert c.qk_norm_full == (arch == "olmoe")
        assert all(lw.moe is not None and lw.w_gate is None for lw in model.weights.layers)
    else:
        assert c.n_experts == 0 and all(lw.moe is None for lw in model.weights.layers)
    assert (c.n_layers, c.n_heads, c.n_kv_heads, c.hidden) == (
        h.num_hidden_layers, h.num_attention_heads, h.num_key_value_heads, h.hidden_size)
    assert c.tied_embeddings == bool(h.tie_word_embeddings)
    if arch in ("mistral", "phi3"):  # one window on every layer
        assert [c.window(i) for i in range(c.n_layers)] == [h.sliding_window] * c.n_layers == [8, 8, 8]
    elif arch == "gemma2":
        assert [c.window(i) for i in range(c.n_layers)] == [8, 0, 8, 0]
        assert [c.is_sliding(i) for i in range(c.n_layers)] == [t == "sliding_attention" for t in h.layer_types]
        assert (c.attn_softcap, c.final_softcap) == (1.5, 2.0) == (h.attn_logit_softcapping, h.final_logit_softcapping)
        assert np.isclose(c.scale, h.query_pre_attn_scalar ** -0.5) and c.embed_scale == 8.0 and c.post_norms
    else:
        assert all(c.window(i) == 0 for i in range(c.n_layers))
    if arch == "granite":
        got = (c.embed_scale, c.residual_scale, c.scale, c.logit_scale)
        want = (h.embedding_multiplier, h.residual_multiplier, h.attention_multiplier, h.logits_scaling)
        assert np.allclose(got, want) and want == (6.0, 0.3, 0.6, 4.0)
    else:
        assert (c.residual_scale, c.logit_scale) == (1.0, 1.0)
    assert [c.uses_rope(i) for i in range(c.n_layers)] == (
        [bool(r) for r in h.no_rope_layers] if arch == "smollm3" else [True] * c.n_layers)
    if arch == "smollm3":
        assert h.no_rope_layers == [1, 1, 1, 0] and c.nope_step == 4
    if arch == "olmo2":
        assert (c.pre_norms, c.post_norms, c.qk_norm, c.qk_norm_full) == (False, True, True, True)
        lw = model.weights.layers[0]
        assert lw.attn_norm is None and lw.ffn_norm is None and lw.q_norm.shape == (c.q_dim,)
        assert lw.k_norm.shape == (c.kv_dim,)
    else:
        assert c.pre_norms and c.qk_norm_full == (arch == "olmoe")


@pytest.mark.parametrize("pair", ["phi3"], indirect=True)
def test_phi3_fused_tensors_split_into_the_halves_hf_uses(pair) -> None:  # type: ignore[no-untyped-def]
    arch, hf, model, path = pair
    from engine.gguf.reader import read_gguf

    g = read_gguf(path)
    assert "blk.0.attn_qkv.weight" in g.tensors and "blk.0.attn_q.weight" not in g.tensors
    assert "blk.0.ffn_gate.weight" not in g.tensors and g.tensors["blk.0.ffn_up.weight"].shape == (320, 64)
    c, lw, mlp = model.config, model.weights.layers[1], hf.model.layers[1].mlp
    qkv = hf.model.layers[1].self_attn.qkv_proj.weight.detach().numpy()
    assert np.array_equal(lw.wq, qkv[: c.q_dim]) and np.array_equal(lw.wk, qkv[c.q_dim: c.q_dim + c.kv_dim])
    assert np.array_equal(lw.wv, qkv[c.q_dim + c.kv_dim:])
    gate_up = mlp.gate_up_proj.weight.detach().numpy()
    assert np.array_equal(lw.w_gate, gate_up[: c.ffn]) and np.array_equal(lw.w_up, gate_up[c.ffn:])


@pytest.mark.parametrize("pair", list(HF_READS_GGUF), indirect=True)
def test_transformers_gguf_reader_reads_our_file_as_the_original(pair) -> None:  # type: ignore[no-untyped-def]
    """Where transformers can read the architecture from GGUF, it gets back the random model we wrote,
    tensor for tensor: an independent check of the writer's names, q/k permutation and fused layouts."""
    arch, hf, _, path = pair
    # pad_token_id: the file has no tokenizer, and phi3's default pad id (32000) is outside the tiny vocab
    # (and its qwen3moe reader does not map expert_feed_forward_length: the expert width is given)
    extra = {"moe_intermediate_size": hf.config.moe_intermediate_size} if arch == "qwen3moe" else {}
    back = causal_lm(path, pad_token_id=0, **extra)
    assert type(back).__name__ == HF_READS_GGUF[arch]
    want = {k: (t + 1.0) - 1.0 if arch == "gemma2" and k.endswith("norm.weight") else t
            for k, t in hf.state_dict().items()}
    got = back.state_dict()
    assert set(got) == set(want)
    for name, t in want.items():
        assert torch.equal(got[name], t), name


def _wrong_models(arch: str, model: Model) -> list[tuple[str, Model]]:
    """Each architecture's distinguishing config data turned off or changed: every one must be caught."""
    c, w = model.config, model.weights
    cfgs: list[tuple[str, ModelConfig]] = []
    if arch in ("mistral", "phi3", "gemma2"):
        cfgs += [("no window", c.with_(sliding_window=0)), ("window + 1", c.with_(sliding_window=9)),
                 ("window - 1", c.with_(sliding_window=7))]
    if arch == "gemma2":
        cfgs += [("no attn softcap", c.with_(attn_softcap=0.0)), ("no final softcap", c.with_(final_softcap=0.0)),
                 ("every layer local", c.with_(sliding_pattern=0)), ("gemma3's pattern", c.with_(sliding_pattern=6))]
    if arch == "granite":
        cfgs += [("no embedding scale", c.with_(embed_scale=1.0)), ("no residual scale", c.with_(residual_scale=1.0)),
                 ("1/sqrt(d) attention", c.with_(attn_scale=0.0)), ("no logit scale", c.with_(logit_scale=1.0))]
    if arch == "smollm3":
        cfgs += [("RoPE on every layer", c.with_(nope_step=0)), ("NoPE every 3rd", c.with_(nope_step=3))]
    if arch in ("qwen3moe", "olmoe"):
        cfgs += [("top-k renormalisation flipped", c.with_(expert_weights_norm=not c.expert_weights_norm)),
                 ("top 1", c.with_(n_experts_used=1)), ("top 3", c.with_(n_experts_used=3))]
    out = [(why, Model(cfg, w)) for why, cfg in cfgs]
    if arch == "phi3":  # the fused halves the other way round
        import copy

        sw = copy.copy(w)
        sw.layers = [copy.copy(lw) for lw in w.layers]
        for lw in sw.layers:
            lw.w_gate, lw.w_up = lw.w_up, lw.w_gate
        out.append(("gate/up swapped", Model(c, sw)))
        kv = copy.copy(w)
        kv.layers = [copy.copy(lw) for lw in w.layers]
        for lw in kv.layers:
            lw.wk, lw.wv = lw.wv, lw.wk
        out.append(("k/v swapped", Model(c, kv)))
    if arch == "olmo2":
        import copy

        for why, drop in (("no q/k norm", ("q_norm", "k_norm")), ("no post-norms", ("post_attn_norm", "post_ffn_norm"))):
            nw = copy.copy(w)
            nw.layers = [copy.copy(lw) for lw in w.layers]
            for lw in nw.layers:
                for f in drop:
                    setattr(lw, f, None)
            cfg = c.with_(qk_norm=False, qk_norm_full=False) if "q_norm" in drop else c
            out.append((why, Model(cfg, nw)))
    return out


def test_each_arch_feature_is_exercised(pair) -> None:  # type: ignore[no-untyped-def]
    arch, hf, model, _ = pair
    wrong = _wrong_models(arch, model)
    assert wrong  # every architecture has its controls
    for why, m in wrong:
        with pytest.raises(AssertionError):
            oracle_check(hf, m, PROMPTS[2])
        print(arch, why, "caught")


def test_batched_lanes_equal_solo(pair) -> None:  # type: ignore[no-untyped-def]
    """step_batch of several lanes is bit-identical to each lane alone (the new config data is per row)."""
    _, _, model, _ = pair
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2][:20], [7]]
    serial, sessions = serial_steps(model, prompts)
    batched = BatchSession(sessions).step_batch([p[-1] + 1 for p in prompts])
    for b, row in enumerate(serial):
        assert np.array_equal(batched[b], row)


def test_phi3_resident_q8_0_matches_plain(tmp_path: Path) -> None:
    """The split row bands of a quantized fused tensor run resident and agree with the plain path."""
    hf = random_hf_model("phi3", seed=3)
    path = write_gguf(hf, "phi3", tmp_path / "q8.gguf", quant=lambda name, a: (quantize_as(QT.Q8_0, a), QT.Q8_0))
    res, plain = load_model(str(path), resident=True), load_model(str(path))
    assert not isinstance(res.weights.layers[0].wq, np.ndarray)  # a resident QuantWeight
    for ids in PROMPTS:
        agree(res, plain, ids, prompt_tol=0.05, decode_tol=0.05)


def test_phi3_fused_tensor_of_the_wrong_height_and_longrope_are_one_line_errors(tmp_path: Path) -> None:
    hf = random_hf_model("phi3", seed=3)
    p = write_gguf(hf, "phi3", tmp_path / "a.gguf", extra_tensors={"rope_factors_long.weight": np.ones(8, np.float32)})
    with pytest.raises(GGUFError, match=r"a.gguf: LongRoPE \('rope_factors_long.weight'\) is not supported"):
        load_model(str(p))
    p = write_gguf(hf, "phi3", tmp_path / "b.gguf", skip=("blk.1.attn_qkv.weight",),
                   extra_tensors={"blk.1.attn_qkv.weight": np.zeros((100, 64), np.float32)})
    with pytest.raises(GGUFError, match=r"fused tensor 'blk.1.attn_qkv.weight' has shape \(100, 64\), expected \(128, 64\)"):
        load_model(str(p))


def _moe_model(tmp_path: Path, quant=None) -> tuple[object, Model]:  # type: ignore[no-untyped-def]
    hf = random_hf_model("qwen3moe", seed=5)
    path = write_gguf(hf, "qwen3moe", tmp_path / "moe.gguf", quant=quant)
    return hf, load_model(str(path), resident=quant is not None)


def test_moe_reads_only_the_chosen_experts_once_per_step(tmp_path: Path) -> None:
    """A decode step reads k experts per layer per lane, and lanes that pick the same expert share its
    read: the batched step counts each chosen expert once, never more than the lanes alone."""
    from engine import Session
    from engine.model.moe import route

    _, m = _moe_model(tmp_path)
    c = m.config
    per_expert = m.weights.layers[0].moe.expert_nbytes(0)  # type: ignore[union-attr]
    all_experts = c.n_layers * c.n_experts * per_expert
    assert per_expert == 3 * c.expert_ffn * c.hidden * 4  # float32 gate + up + down
    s = Session(m)
    s.prefill(PROMPTS[1])
    before = m.expert_bytes_read
    s.step(5)
    solo = m.expert_bytes_read - before
    assert solo == c.n_layers * c.n_experts_used * per_expert == all_experts // 4  # 2 of 8 per layer
    s.free()
    # batched: the bytes are the union of the lanes' choices, layer by layer (recomputed from the router)
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2][:20], PROMPTS[0]]  # lanes 0 and 3 choose alike
    serial, sessions = serial_steps(m, prompts)
    before = m.expert_bytes_read
    BatchSession(sessions).step_batch([p[-1] + 1 for p in prompts])
    batched = m.expert_bytes_read - before
    assert solo < batched < len(prompts) * solo
    chosen = _chosen_experts(m, prompts)
    assert batched == sum(len(set().union(*layer)) for layer in chosen) * per_expert
    assert [sorted(layer[0]) for layer in chosen] == [sorted(layer[3]) for layer in chosen]
    assert route(np.array([[0.0, 3.0, 1.0, 2.0]], np.float32), 2, True)[0].tolist() == [[1, 3]]


def _chosen_experts(m: Model, prompts: list[list[int]]) -> list[list[set[int]]]:
    """[layer][lane] -> the experts that lane's next token (its last + 1) picks, from a forward whose MoE
    layers are wrapped to record the router's choice."""
    from engine import Session
    from engine.model import forward as fw
    from engine.model.moe import route

    out: list[list[set[int]]] = [[set() for _ in prompts] for _ in range(m.config.n_layers)]
    seen: list[np.ndarray] = []
    real = fw.moe_ffn

    def spy(h, ex, k, renorm, act, mm):  # type: ignore[no-untyped-def]
        seen.append(route(mm(h, ex.router), k, renorm)[0])
        return real(h, ex, k, renorm, act, mm)

    fw.moe_ffn = spy  # type: ignore[assignment]
    try:
        for lane, p in enumerate(prompts):
            s = Session(m)
            s.prefill(p)
            seen.clear()
            s.step(p[-1] + 1)
            s.free()
            for li, top in enumerate(seen):
                out[li][lane] = {int(e) for e in top[0]}
    finally:
        fw.moe_ffn = real  # type: ignore[assignment]
    return out


def test_moe_resident_q8_0_matches_plain_and_batches_bit_exact(tmp_path: Path) -> None:
    _, res = _moe_model(tmp_path, quant=lambda name, a: (quantize_as(QT.Q8_0, a), QT.Q8_0))
    plain = load_model(str(tmp_path / "moe.gguf"))
    ex = res.weights.layers[0].moe
    assert not isinstance(ex.gate[0], np.ndarray)  # type: ignore[union-attr]
    assert ex.gate[0].group is not None and ex.gate[0].group is ex.up[0].group  # one launch per chosen expert
    # the file's tensors, not their per-expert bands: norms (output, then attn / ffn / q / k per layer) and
    # the matrices (embedding, head, then q / k / v / o, router, three expert stacks per layer)
    assert res.tensor_types == {"F32": 1 + 4 * 3, "Q8_0": 2 + 8 * 3}
    for ids in PROMPTS:
        agree(res, plain, ids, prompt_tol=0.05, decode_tol=0.05)
    prompts = [PROMPTS[0], PROMPTS[1], [7], PROMPTS[0]]
    serial, sessions = serial_steps(res, prompts)
    batched = BatchSession(sessions).step_batch([p[-1] + 1 for p in prompts])
    for b, row in enumerate(serial):
        assert np.array_equal(batched[b], row)


def test_moe_metadata_and_tensor_errors_are_one_line(tmp_path: Path) -> None:
    from engine.gguf.config import from_gguf_metadata

    md = {"general.architecture": "qwen3moe", "qwen3moe.embedding_length": 64, "qwen3moe.block_count": 1,
          "qwen3moe.attention.head_count": 4, "qwen3moe.expert_count": 8, "qwen3moe.expert_used_count": 9,
          "qwen3moe.expert_feed_forward_length": 32}
    with pytest.raises(GGUFError, match="m.gguf: expert_used_count 9 exceeds expert_count 8"):
        from_gguf_metadata(md, "m.gguf")
    for key, val, what in (("expert_gating_func", 2, "softmax only"), ("expert_weights_scale", 2.5, "not supported"),
                           ("attention.clamp_kqv", 8.0, "clipped")):
        with pytest.raises(GGUFError, match=f"qwen3moe.{key} .*{what}"):
            from_gguf_metadata({**md, "qwen3moe.expert_used_count": 2, f"qwen3moe.{key}": val}, "m.gguf")
    with pytest.raises(GGUFError, match="missing metadata key 'qwen3moe.expert_count'"):
        from_gguf_metadata({k: v for k, v in md.items() if k != "qwen3moe.expert_count"}, "m.gguf")
    hf = random_hf_model("qwen3moe", seed=5)
    p = write_gguf(hf, "qwen3moe", tmp_path / "x.gguf", skip=("blk.2.ffn_down_exps.weight",))
    with pytest.raises(GGUFError, match=r"x.gguf: missing tensor 'blk.2.ffn_down_exps.weight' \(architecture qwen3moe\)"):
        load_model(str(p))


def test_moe_memory_plan_counts_the_chosen_experts_per_token(tmp_path: Path) -> None:
    """q4kdiag's header-only plan: an expert stack is resident per expert, and a token reads k of them;
    the plan's bytes per token equal what a loaded model's decode step reads, embedding row aside."""
    from engine import Session
    from engine.gguf.reader import read_gguf
    from engine.model.diag import plan

    _, res = _moe_model(tmp_path, quant=lambda name, a: (quantize_as(QT.Q8_0, a), QT.Q8_0))
    g = read_gguf(tmp_path / "moe.gguf")
    c, w = res.config, res.weights
    p = plan(g)
    assert p.resident_bytes == w.nbytes  # every tensor resident as loaded, expert bands included
    s = Session(res)
    s.prefill([1, 2, 3])
    before = res.expert_bytes_read
    s.step(4)
    experts = res.expert_bytes_read - before
    s.free()
    dense = w.nbytes - sum(lw.moe.nbytes for lw in w.layers) + sum(int(lw.moe.router.nbytes) for lw in w.layers)  # type: ignore[union-attr]
    emb = int(w.token_embd.nbytes)
    assert p.bytes_per_token == dense - emb + emb // c.vocab_size + experts


def test_speculative_verification_rows_equal_one_row_steps(pair) -> None:  # type: ignore[no-untyped-def]
    """A draft verified in one step (k+1 rows through the batched kernels) gives the tokens one-row steps
    give, on every architecture (windows, softcaps, MoE routing): drafts right, wrong, and mixed."""
    from engine.sched.lane import Request
    from engine.sched.scheduler import NativeScheduler
    from support.sched_helpers import ScriptedDrafter, use_drafter

    _, _, model, _ = pair
    plain = NativeScheduler(model, prefill_chunk=1024, thread=False, prefix_cache=False)
    hs = [plain.admit(Request(p, max_new_tokens=24, stop_on_eos=False)) for p in PROMPTS]
    while plain.step():
        pass
    answers = {tuple(p): h.result(0).token_ids for p, h in zip(PROMPTS, hs, strict=True)}
    vocab = int(model.config.vocab_size)
    for wrong_every in (0, 1, 3):
        sched = use_drafter(NativeScheduler(model, prefill_chunk=1024, speculative="ngram", thread=False,
                                            prefix_cache=False),
                            ScriptedDrafter(answers, k=5, wrong_every=wrong_every, vocab=vocab))
        hs = [sched.admit(Request(p, max_new_tokens=24, stop_on_eos=False)) for p in PROMPTS]
        while sched.step():
            pass
        assert [h.result(0).token_ids for h in hs] == [answers[tuple(p)] for p in PROMPTS], wrong_every
        assert sched.stats().spec_drafted > 0 and sched.pool.num_used == 0
