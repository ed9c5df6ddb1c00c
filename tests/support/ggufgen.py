"""Tiny random HF models -> GGUF files, the way llama.cpp's convert_hf_to_gguf.py names and permutes them.

HF random init, then norms/biases/q-k-norms randomized too (HF inits them to 1/0, which would
hide bugs), written with gguf.GGUFWriter so transformers can read the file back with gguf_file=.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

ARCH_MODEL = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
              "gemma3": "Gemma3ForCausalLM", "mistral": "MistralForCausalLM", "granite": "GraniteForCausalLM",
              "gemma2": "Gemma2ForCausalLM", "phi3": "Phi3ForCausalLM", "olmo2": "Olmo2ForCausalLM",
              "qwen3moe": "Qwen3MoeForCausalLM", "smollm3": "SmolLM3ForCausalLM", "olmoe": "OlmoeForCausalLM"}
# The GGUF architecture each one is written as (llama.cpp's convert_hf_to_gguf.py writes Mistral as llama).
GGUF_ARCH = {"mistral": "llama"}
# Written the way convert_hf_to_gguf.py does it, tensor names from the gguf package's own per-arch map.
MAPPED_ARCHS = ("mistral", "granite", "gemma2", "phi3", "olmo2", "smollm3")
PERMUTED_QK = ("llama", "mistral", "granite", "smollm3")  # rope NORM in llama.cpp: q/k rows permuted by the converter


def hf_config(arch: str, vocab: int = 320):  # type: ignore[no-untyped-def]
    import transformers

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6,
                  initializer_range=0.08, tie_word_embeddings=False)
    if arch == "llama":
        return transformers.LlamaConfig(**common, rope_theta=10000.0)
    if arch == "qwen2":
        return transformers.Qwen2Config(**common, rope_theta=1_000_000.0)
    if arch == "qwen3":
        # head_dim 128: transformers' GGUF reader ignores qwen3.attention.key_length and assumes 128.
        return transformers.Qwen3Config(**{**common, "tie_word_embeddings": True}, head_dim=128, rope_theta=1_000_000.0)
    if arch == "gemma3":
        # 6 layers: 5 sliding (window 8, rope base 1e4) + 1 global (1e6); head_dim 256 so HF's default
        # query_pre_attn_scalar (256) and llama.cpp's 1/sqrt(head_dim) agree.
        return transformers.Gemma3TextConfig(**{**common, "num_hidden_layers": 6, "num_attention_heads": 2,
                                                "num_key_value_heads": 1, "tie_word_embeddings": True},
                                             head_dim=256, sliding_window=8)
    ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)  # the HF defaults (32000, ...) exceed the vocab
    if arch == "mistral":  # the window (8) is shorter than the third prompt: it is exercised
        return transformers.MistralConfig(**common, **ids, head_dim=16, sliding_window=8, rope_theta=10000.0)
    if arch == "granite":  # multipliers far from 1 (and an attention scale far from 1/sqrt(16)) so each one shows
        return transformers.GraniteConfig(**common, **ids, rope_theta=10000.0, embedding_multiplier=6.0,
                                          residual_multiplier=0.3, attention_multiplier=0.6, logits_scaling=4.0)
    if arch == "gemma2":
        # 4 layers alternating local (window 8) / global; softcaps small enough to bend the tiny model's
        # scores and logits (the real models' 50 / 30 would be the identity here)
        return transformers.Gemma2Config(**{**common, "num_hidden_layers": 4, "num_attention_heads": 2,
                                            "num_key_value_heads": 1, "tie_word_embeddings": True}, **ids,
                                         head_dim=32, query_pre_attn_scalar=32, sliding_window=8,
                                         attn_logit_softcapping=1.5, final_logit_softcapping=2.0)
    if arch == "phi3":
        return transformers.Phi3Config(**common, **ids, sliding_window=8, rope_theta=10000.0)
    if arch == "olmo2":
        return transformers.Olmo2Config(**common, **ids, rope_theta=500000.0)
    if arch == "smollm3":  # 4 layers: the 4th has no RoPE (NoPE every 4th layer, as llama.cpp hard-codes)
        return transformers.SmolLM3Config(**{**common, "num_hidden_layers": 4}, **ids, rope_theta=10000.0,
                                          no_rope_layer_interval=4)
    if arch == "qwen3moe":  # 8 experts of width 32, top 2 renormalised (as llama.cpp always does for qwen3moe)
        return transformers.Qwen3MoeConfig(**common, **ids, head_dim=16, rope_theta=1_000_000.0, num_experts=8,
                                           num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
    if arch == "olmoe":  # experts as wide as intermediate_size (32), top 2 of 8, not renormalised
        return transformers.OlmoeConfig(**{**common, "intermediate_size": 32}, **ids, rope_theta=10000.0,
                                        num_experts=8, num_experts_per_tok=2, norm_topk_prob=False)
    raise ValueError(arch)


def random_hf_model(arch: str, seed: int = 0):  # type: ignore[no-untyped-def]
    import torch
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, ARCH_MODEL[arch])(hf_config(arch)).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):  # a MoE router: spread so the top-k is never a near-tie
                p.copy_(0.5 * torch.randn_like(p))
            elif ".experts." in name:
                p.copy_(0.08 * torch.randn_like(p))
    return model


def permute_qk(w: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: HF rotate-half rows -> interleaved pairs (rope NORM mode)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


_GEMMA3_NAMES = {
    **_LAYER_NAMES,
    "post_attention_layernorm.weight": "post_attention_norm.weight",  # gemma: after attention, not pre-FFN
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def _mapped_tensors(model, arch: str) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    import gguf

    cfg = model.config
    enum = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[GGUF_ARCH.get(arch, arch)]
    names = gguf.get_tensor_name_map(enum, cfg.num_hidden_layers)
    out: dict[str, np.ndarray] = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        a = t.detach().float().numpy()
        gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gname is None:
            raise KeyError(f"{arch}: no GGUF name for {name}")
        if arch == "gemma2" and name.endswith("norm.weight"):
            a = a + 1.0  # stored as (1 + w), as for gemma3
        if arch in PERMUTED_QK and gname.endswith(("attn_q.weight", "attn_k.weight")):
            kv = cfg.num_attention_heads if gname.endswith("attn_q.weight") else cfg.num_key_value_heads
            a = permute_qk(a, cfg.num_attention_heads, kv)
        out[gname] = a
    return out


def arch_kv(model, arch: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """The per-architecture metadata convert_hf_to_gguf.py writes beyond the common keys (floats as
    float32: add_kv)."""
    cfg, a = model.config, GGUF_ARCH.get(arch, arch)
    kv: dict[str, object] = {}
    if arch in ("mistral", "phi3", "gemma2", "gemma3") and getattr(cfg, "sliding_window", None):
        kv[f"{a}.attention.sliding_window"] = int(cfg.sliding_window)
    if arch == "mistral":
        kv["general.name"] = "Tiny Mistral"  # not "mistral": transformers' GGUF reader would then ask gguf-py
        # for a "mistral" architecture, which it does not have (and fails); it reads the file as llama
    if arch == "granite":
        kv.update({f"{a}.embedding_scale": float(cfg.embedding_multiplier),
                   f"{a}.residual_scale": float(cfg.residual_multiplier),
                   f"{a}.attention.scale": float(cfg.attention_multiplier),
                   f"{a}.logit_scale": float(cfg.logits_scaling)})
    if arch in ("qwen3moe", "olmoe"):
        kv.update({f"{a}.expert_count": int(cfg.num_experts), f"{a}.expert_used_count": int(cfg.num_experts_per_tok)})
    if arch == "qwen3moe":  # olmoe's experts are feed_forward_length wide: no key of their own
        kv[f"{a}.expert_feed_forward_length"] = int(cfg.moe_intermediate_size)
    if arch == "gemma2":
        kv.update({f"{a}.attn_logit_softcapping": float(cfg.attn_logit_softcapping),
                   f"{a}.final_logit_softcapping": float(cfg.final_logit_softcapping)})
    return kv


def _moe_tensors(model) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    """qwen3moe: attention as qwen3; the router as ffn_gate_inp, HF's fused expert stacks (gate_up_proj
    [E, 2I, H], gate first; down_proj [E, H, I]) as ffn_{gate,up,down}_exps, as convert_hf_to_gguf.py."""
    out: dict[str, np.ndarray] = {}
    rest = {}
    for name, t in model.state_dict().items():
        a = t.detach().float().numpy()
        parts = name.split(".")
        if name.endswith("mlp.gate.weight"):
            out[f"blk.{parts[2]}.ffn_gate_inp.weight"] = a
        elif name.endswith("mlp.experts.gate_up_proj"):
            half = a.shape[1] // 2
            out[f"blk.{parts[2]}.ffn_gate_exps.weight"] = np.ascontiguousarray(a[:, :half])
            out[f"blk.{parts[2]}.ffn_up_exps.weight"] = np.ascontiguousarray(a[:, half:])
        elif name.endswith("mlp.experts.down_proj"):
            out[f"blk.{parts[2]}.ffn_down_exps.weight"] = a
        else:
            rest[name] = t
    out.update(_dense_tensors(model.config, rest, "qwen3"))  # the rest is named as for qwen3
    return out


def gguf_tensors(model, arch: str) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    if arch in MAPPED_ARCHS:
        return _mapped_tensors(model, arch)
    if arch in ("qwen3moe", "olmoe"):
        return _moe_tensors(model)
    return _dense_tensors(model.config, model.state_dict(), arch)


def _dense_tensors(cfg, state: dict, arch: str) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def,type-arg]
    names = _GEMMA3_NAMES if arch == "gemma3" else _LAYER_NAMES
    out: dict[str, np.ndarray] = {}
    for name, t in state.items():
        a = t.detach().float().numpy()
        if arch == "gemma3" and name.endswith("norm.weight"):
            a = a + 1.0  # llama.cpp's Gemma converter stores (1 + w): GGUF norms are plain multipliers
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = a
        elif name == "model.norm.weight":
            out["output_norm.weight"] = a
        elif name == "lm_head.weight":
            if not cfg.tie_word_embeddings:
                out["output.weight"] = a
        else:
            parts = name.split(".")  # model.layers.{i}.rest
            i, rest = int(parts[2]), ".".join(parts[3:])
            gname = names[rest]
            if arch == "llama" and gname in ("attn_q.weight", "attn_k.weight"):
                kv = cfg.num_attention_heads if gname == "attn_q.weight" else cfg.num_key_value_heads
                a = permute_qk(a, cfg.num_attention_heads, kv)
            out[f"blk.{i}.{gname}"] = a
    return out


def add_kv(w, key: str, val: object) -> None:  # type: ignore[no-untyped-def]
    """One metadata item with the GGUF type its Python value suggests (str, list -> array, int -> uint32)."""
    if isinstance(val, str):
        w.add_string(key, val)
    elif isinstance(val, list):
        w.add_array(key, val)
    elif isinstance(val, float):
        w.add_float32(key, val)
    else:
        w.add_uint32(key, val)


def write_gguf(model, arch: str, path: Path, matrix_dtype: type = np.float32,  # type: ignore[no-untyped-def]
               extra_kv: dict | None = None, skip: tuple[str, ...] = (),  # type: ignore[type-arg]
               quant=None, extra_tensors: dict | None = None) -> Path:  # type: ignore[no-untyped-def,type-arg]
    """`quant(name, matrix)`, if given, returns (block bytes uint8 [rows, row_bytes], GGML type) for
    each 2-D tensor: the file then holds those blocks (quantized fixtures). `extra_tensors` (name ->
    float32 array) are written as they are after the model's (malformed-file tests)."""
    import gguf

    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w = gguf.GGUFWriter(str(path), GGUF_ARCH.get(arch, arch))
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    rp = getattr(cfg, "rope_parameters", None) or {}
    theta = getattr(cfg, "rope_theta", None) or rp.get("full_attention", rp).get("rope_theta")
    w.add_rope_freq_base(float(theta))
    w.add_rope_dimension_count(head_dim)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_vocab_size(cfg.vocab_size)
    for k, v in arch_kv(model, arch).items():
        add_kv(w, k, v)
    for k, v in (extra_kv or {}).items():
        add_kv(w, k, v)
    for name, a in gguf_tensors(model, arch).items():
        if name in skip:
            continue
        if a.ndim >= 2 and quant is not None:  # a 3-D expert stack: quantized as its rows, kept 3-D
            raw, qtype = quant(name, a.reshape(-1, a.shape[-1]))
            w.add_tensor(name, np.ascontiguousarray(raw).reshape(*a.shape[:-1], raw.shape[-1]), raw_dtype=qtype)
            continue
        if a.ndim == 2 and matrix_dtype != np.float32:
            a = a.astype(matrix_dtype)
        w.add_tensor(name, np.ascontiguousarray(a))
    for name, a in (extra_tensors or {}).items():
        w.add_tensor(name, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:  # type: ignore[no-untyped-def]
    """HF greedy decode with its own KV cache (no EOS stop, no logits processors)."""
    import torch

    out_ids: list[int] = []
    with torch.no_grad():
        out = hf(torch.tensor([ids]), use_cache=True)
        for _ in range(n):
            tok = int(torch.argmax(out.logits[0, -1]))
            out_ids.append(tok)
            out = hf(torch.tensor([[tok]]), past_key_values=out.past_key_values, use_cache=True)
    return out_ids


def hf_decode_logits(hf, ids: list[int], n: int) -> tuple[list[int], np.ndarray]:  # type: ignore[no-untyped-def]
    """HF's greedy tokens and the logits of the prompt's last position and each of the n decode steps
    (HF's own KV cache: past_key_values), float32 [n + 1, vocab]."""
    import torch

    toks: list[int] = []
    rows = []
    with torch.no_grad():
        out = hf(torch.tensor([ids]), use_cache=True)
        for _ in range(n + 1):
            rows.append(out.logits[0, -1].float().numpy())
            if len(toks) == n:
                break
            toks.append(int(np.argmax(rows[-1])))
            out = hf(torch.tensor([[toks[-1]]]), past_key_values=out.past_key_values, use_cache=True)
    return toks, np.stack(rows)


def ours_decode_logits(model, ids: list[int], toks: list[int]) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Our logits for the same positions: prefill, then decode steps fed `toks` (paged KV cache)."""
    from engine import Session

    s = Session(model)
    rows = [s.prefill(ids).copy()]
    for tok in toks:
        rows.append(s.step(tok).copy())
    s.free()
    return np.stack(rows)


# float32 vs float32 on the tiny random models (measured, the four archs and PROMPTS of
# test_oracle_tiny.py): max |logit diff| 3.4e-5 (gemma3; llama/qwen ~2e-6) over every prompt
# position and decode step, hidden states per layer within 6.7e-6 relative (L2 of a row's
# difference over the row's norm). The defaults are ~3x that.
LOGIT_TOL = 1e-4
REL_TOL = 2e-5


def oracle_check(hf, model, ids: list[int], n_decode: int = 16, logit_tol: float = LOGIT_TOL,  # type: ignore[no-untyped-def]
                 rel_tol: float = REL_TOL) -> dict[str, float]:
    """Our engine against HF on one prompt: the residual stream after every layer (cosine >= 0.9999
    and relative L2 error <= rel_tol at every position), the logits at every prompt position (same
    argmax, max |diff| <= logit_tol), then n_decode greedy decode steps with each side's own KV cache
    (same tokens, logits within logit_tol). Asserts them and returns the figures."""
    import torch

    with torch.no_grad():
        out = hf(torch.tensor([ids]), output_hidden_states=True)
    theirs = [h[0].float().numpy() for h in out.hidden_states]
    states, logits = model.hidden_states(ids)
    assert len(theirs) == len(states) == model.config.n_layers + 1
    min_cos, max_rel = 1.0, 0.0
    for layer, (a, b) in enumerate(zip(theirs, states, strict=False)):
        cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
        assert cos.min() >= 0.9999, f"layer {layer}: cosine {cos.min():.6f} at position {int(cos.argmin())}"
        rel = np.linalg.norm(a - b, axis=-1) / np.linalg.norm(a, axis=-1)
        assert rel.max() <= rel_tol, f"layer {layer}: relative L2 error {rel.max():.2e} at position {int(rel.argmax())}"
        min_cos, max_rel = min(min_cos, float(cos.min())), max(max_rel, float(rel.max()))
    ref = out.logits[0].float().numpy()
    assert np.array_equal(ref.argmax(-1), logits.argmax(-1)), "argmax differs at some prompt position"
    diff = np.abs(ref - logits).max(-1)
    assert diff.max() <= logit_tol, f"max |logit diff| {diff.max():.2e} at prompt position {int(diff.argmax())}"
    figures = {"min_cos": min_cos, "max_rel_l2": max_rel, "prompt_logit_diff": float(diff.max())}
    if n_decode:
        toks, theirs_dec = hf_decode_logits(hf, ids, n_decode)
        ours_dec = ours_decode_logits(model, ids, toks)
        assert [int(t) for t in ours_dec[:-1].argmax(-1)] == toks, f"greedy tokens differ: hf {toks}"
        dd = np.abs(theirs_dec - ours_dec).max(-1)
        assert dd.max() <= logit_tol, f"max |logit diff| {dd.max():.2e} at decode step {int(dd.argmax())}"
        figures["decode_logit_diff"] = float(dd.max())
        figures["greedy"] = toks  # type: ignore[assignment]
    figures["max_logit_diff"] = figures["prompt_logit_diff"]
    return figures


def tiny_llama_gguf(path: Path, arch: str = "llama", tensors: dict[str, np.ndarray] | None = None,
           raw_types: dict[str, gguf.GGMLQuantizationType] | None = None, kv: dict[str, object] | None = None) -> Path:
    """A tiny valid llama GGUF (hidden 32, ffn 256, 1 layer, vocab 64), with overrides (`kv`: metadata
    key -> value, written with the value's own GGUF type)."""
    w = gguf.GGUFWriter(str(path), arch)
    meta: dict[str, object] = {f"{arch}.embedding_length": 32, f"{arch}.block_count": 1,
                               f"{arch}.feed_forward_length": 256, f"{arch}.attention.head_count": 2,
                               f"{arch}.attention.head_count_kv": 2, f"{arch}.context_length": 128,
                               f"{arch}.vocab_size": 64, **(kv or {})}
    for key, val in meta.items():
        add_kv(w, key, val)
    rng = np.random.default_rng(0)
    base = {
        "token_embd.weight": (64, 32), "output_norm.weight": (32,), "blk.0.attn_norm.weight": (32,),
        "blk.0.attn_q.weight": (32, 32), "blk.0.attn_k.weight": (32, 32), "blk.0.attn_v.weight": (32, 32),
        "blk.0.attn_output.weight": (32, 32), "blk.0.ffn_norm.weight": (32,), "blk.0.ffn_gate.weight": (256, 32),
        "blk.0.ffn_up.weight": (256, 32), "blk.0.ffn_down.weight": (32, 256),
    }
    arrays = {k: rng.standard_normal(s).astype(np.float32) for k, s in base.items()}
    arrays.update(tensors or {})
    for name, a in arrays.items():
        if a is None:
            continue
        if raw_types and name in raw_types:
            w.add_tensor(name, a, raw_dtype=raw_types[name])
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_hf_llama(seed: int = 0):  # type: ignore[no-untyped-def]
    """A random HF llama with rows of 256 and 512 values (K-quant super-blocks), norms randomized."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   rms_norm_eps=1e-6, initializer_range=0.08, tie_word_embeddings=False,
                                   rope_theta=10000.0)
    model = transformers.LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    return model
