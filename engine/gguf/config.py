"""ModelConfig: everything the forward pass needs to know, per-architecture differences as data.

`from_gguf_metadata` maps `{arch}.*` GGUF keys (llama.cpp naming) to a config; the architectures
differ only in the fields below, never in a copy of the forward pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from engine.errors import GGUFError

SUPPORTED_ARCHS = ("llama", "granite", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "olmo2", "qwen3moe", "olmoe", "smollm3")

ROPE_NORM = "norm"  # llama.cpp mode 0: rotate adjacent pairs (2i, 2i+1); llama GGUF Q/K are permuted for it
ROPE_NEOX = "neox"  # rotate (i, i + d/2): HF rotate_half; qwen2, qwen3, gemma2/3, phi3, olmo2


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    rope_style: str = ROPE_NORM
    rope_scale: float = 1.0  # linear position scaling (positions are divided by it)
    rope_base_local: float | None = None  # sliding-window layers' own base (gemma3: 10000)
    qkv_bias: bool = False  # qwen2
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (qwen3, gemma3)
    qk_norm_full: bool = False  # olmo2: that RMSNorm spans the whole q / k projection, not one head
    pre_norms: bool = True  # olmo2: False -> no norm before attention / FFN (attn_norm, ffn_norm absent)
    post_norms: bool = False  # gemma2/3, olmo2: norm after attention and after the FFN, before the residual add
    residual_scale: float = 1.0  # granite: attention / FFN output scaled before the residual add
    logit_scale: float = 1.0  # granite: logits divided by it
    act: str = "silu"  # "silu" | "gelu_tanh" (gated in both cases)
    embed_scale: float = 1.0  # gemma3: sqrt(hidden)
    attn_scale: float = 0.0  # 0 -> 1/sqrt(head_dim)
    nope_step: int = 0  # smollm3: 4 -> layer i has no RoPE when (i + 1) % 4 == 0 (llama.cpp: a constant, no key)
    sliding_window: int = 0  # 0 -> none
    sliding_pattern: int = 0  # gemma3: 6 -> layer i is global when (i + 1) % 6 == 0 (gemma2: 2); 0 -> all local if window
    attn_softcap: float = 0.0  # gemma2-style; 0 -> off
    final_softcap: float = 0.0
    n_experts: int = 0  # qwen3moe, olmoe: experts per layer (every layer); 0 -> a dense FFN
    n_experts_used: int = 0  # top-k
    expert_ffn: int = 0  # each expert's FFN width
    expert_weights_norm: bool = False  # the top-k router weights renormalised to sum 1
    tied_embeddings: bool = True
    context_length: int = 4096
    bos_id: int | None = None
    eos_id: int | None = None

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def scale(self) -> float:
        return self.attn_scale if self.attn_scale > 0 else 1.0 / math.sqrt(self.head_dim)

    def is_sliding(self, layer: int) -> bool:
        if self.sliding_window <= 0:
            return False
        if self.sliding_pattern <= 0:
            return True
        return (layer + 1) % self.sliding_pattern != 0

    def window(self, layer: int) -> int:
        """Attention window of a layer in positions (0 = unbounded causal)."""
        return self.sliding_window if self.is_sliding(layer) else 0

    def uses_rope(self, layer: int) -> bool:
        return self.nope_step <= 0 or (layer + 1) % self.nope_step != 0

    def rope_theta(self, layer: int) -> float:
        if self.is_sliding(layer) and self.rope_base_local is not None:
            return self.rope_base_local
        return self.rope_base

    def rope_pos_scale(self, layer: int) -> float:
        """Linear position scaling of a layer (gemma3 scales only its global layers, as llama.cpp does)."""
        if self.is_sliding(layer) and self.rope_base_local is not None:
            return 1.0
        return self.rope_scale

    def with_(self, **kw: Any) -> ModelConfig:
        return replace(self, **kw)


_REQUIRED: Any = object()


def _num(md: Mapping[str, Any], key: str, where: str, kind: type, default: Any = _REQUIRED, *, positive: bool = False) -> Any:
    """A numeric metadata value of `kind` (int or float); a missing required key, a value of another type
    (string, array, bool) or a non-positive value where one is needed is one GGUFError naming the key."""
    v = md.get(key, default)
    if v is _REQUIRED:
        raise GGUFError(f"{where}: missing metadata key {key!r}")
    if v is None:  # an optional key without a default (token ids)
        return None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (kind is float or float(v).is_integer())
    if not ok:
        raise GGUFError(f"{where}: metadata key {key!r} must be {'an integer' if kind is int else 'a number'}, got {v!r}")
    out = kind(v)
    if positive and out <= 0:
        raise GGUFError(f"{where}: metadata key {key!r} must be positive, got {v!r}")
    return out


def from_gguf_metadata(md: Mapping[str, Any], where: str = "<gguf>") -> ModelConfig:
    """Metadata dict (key -> python value) -> ModelConfig; refuses unknown architectures."""
    arch = md.get("general.architecture")
    if arch is None:
        raise GGUFError(f"{where}: missing metadata key 'general.architecture'")
    if arch not in SUPPORTED_ARCHS:
        raise GGUFError(f"{where}: unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})")
    a = arch
    hidden = _num(md, f"{a}.embedding_length", where, int, positive=True)
    n_heads = _num(md, f"{a}.attention.head_count", where, int, positive=True)
    n_kv = _num(md, f"{a}.attention.head_count_kv", where, int, n_heads, positive=True)
    if n_heads % n_kv:
        raise GGUFError(f"{where}: {n_heads} attention heads are not a multiple of {n_kv} KV heads")
    head_dim = _num(md, f"{a}.attention.key_length", where, int, hidden // n_heads, positive=True)
    toks = md.get("tokenizer.ggml.tokens")
    # 0: the loader fills it from token_embd
    vocab = _num(md, f"{a}.vocab_size", where, int, len(toks) if isinstance(toks, (list, tuple)) else 0)
    scaling = md.get(f"{a}.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise GGUFError(f"{where}: unsupported rope scaling {scaling!r} (supported: none, linear)")
    rope_scale = _num(md, f"{a}.rope.scaling.factor", where, float, 1.0, positive=True) if scaling == "linear" else 1.0
    rope_dims = md.get(f"{a}.rope.dimension_count")
    if rope_dims is not None and _num(md, f"{a}.rope.dimension_count", where, int) != head_dim:
        raise GGUFError(f"{where}: partial rotary embedding ({rope_dims} of {head_dim} dims) is not supported")
    moe = a == "qwen3moe"  # its dense FFN width is unused (every layer is sparse) and may be absent
    base = dict(
        arch=a,
        vocab_size=vocab,
        hidden=hidden,
        n_layers=_num(md, f"{a}.block_count", where, int, positive=True),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        ffn=_num(md, f"{a}.feed_forward_length", where, int, 0 if moe else _REQUIRED, positive=not moe),
        norm_eps=_num(md, f"{a}.attention.layer_norm_rms_epsilon", where, float, 1e-5),
        rope_base=_num(md, f"{a}.rope.freq_base", where, float, 10000.0, positive=True),
        rope_scale=rope_scale,
        context_length=_num(md, f"{a}.context_length", where, int, 4096, positive=True),
        bos_id=_num(md, "tokenizer.ggml.bos_token_id", where, int, None),
        eos_id=_num(md, "tokenizer.ggml.eos_token_id", where, int, None),
    )
    window = _num(md, f"{a}.attention.sliding_window", where, int, 0)  # mistral (as llama), phi3, gemma2/3
    if a in ("llama", "granite", "smollm3"):
        # granite's multipliers (llama.cpp keys); absent in a llama file, so 1 / 0 there
        return ModelConfig(
            **base, rope_style=ROPE_NORM, sliding_window=window, nope_step=4 if a == "smollm3" else 0,
            embed_scale=_num(md, f"{a}.embedding_scale", where, float, 1.0, positive=True),
            residual_scale=_num(md, f"{a}.residual_scale", where, float, 1.0, positive=True),
            attn_scale=_num(md, f"{a}.attention.scale", where, float, 0.0),
            logit_scale=_num(md, f"{a}.logit_scale", where, float, 1.0, positive=True),
        )
    if a == "qwen2":
        return ModelConfig(**base, rope_style=ROPE_NEOX, qkv_bias=True)
    if a == "qwen3":
        return ModelConfig(**base, rope_style=ROPE_NEOX, qk_norm=True)
    if a in ("qwen3moe", "olmoe"):
        n_exp = _num(md, f"{a}.expert_count", where, int, positive=True)
        used = _num(md, f"{a}.expert_used_count", where, int, positive=True)
        if used > n_exp:
            raise GGUFError(f"{where}: expert_used_count {used} exceeds expert_count {n_exp}")
        if md.get(f"{a}.attention.clamp_kqv"):
            raise GGUFError(f"{where}: {a}.attention.clamp_kqv (clipped q/k/v) is not supported")
        if md.get(f"{a}.expert_weights_scale", 0) not in (0, 1):
            raise GGUFError(f"{where}: {a}.expert_weights_scale {md[f'{a}.expert_weights_scale']!r} is not supported")
        if md.get(f"{a}.expert_gating_func", 1) != 1:  # llama.cpp: 1 = softmax, 2 = sigmoid
            raise GGUFError(f"{where}: {a}.expert_gating_func {md[f'{a}.expert_gating_func']!r} is not supported "
                            f"(softmax only)")
        # llama.cpp renormalises qwen3moe's top-k, not olmoe's; olmoe's experts are feed_forward_length wide
        norm_w = md.get(f"{a}.expert_weights_norm", a == "qwen3moe")
        expert_ffn = _num(md, f"{a}.expert_feed_forward_length", where, int,
                          _REQUIRED if moe else base["ffn"], positive=True)
        return ModelConfig(**base, rope_style=ROPE_NEOX, qk_norm=True, qk_norm_full=a == "olmoe", n_experts=n_exp,
                           n_experts_used=used, expert_ffn=expert_ffn, expert_weights_norm=bool(norm_w))
    if a == "phi3":  # fused attn_qkv / ffn_up are split by the loader
        return ModelConfig(**base, rope_style=ROPE_NEOX, sliding_window=window)
    if a == "olmo2":
        return ModelConfig(**base, rope_style=ROPE_NEOX, qk_norm=True, qk_norm_full=True, pre_norms=False,
                           post_norms=True)
    # gemma2 / gemma3 (llama.cpp: f_attention_scale = 1/sqrt(head_dim) except the 27B models, 46 / 62
    # layers, which use hidden/heads)
    big = base["n_layers"] == (46 if a == "gemma2" else 62)
    qpas = hidden // n_heads if big else head_dim
    gemma = dict(rope_style=ROPE_NEOX, post_norms=True, act="gelu_tanh", embed_scale=math.sqrt(hidden),
                 attn_scale=1.0 / math.sqrt(qpas), sliding_window=window)
    if a == "gemma2":  # every other layer local (0, 2, ...), one RoPE base, tanh softcaps on scores and logits
        return ModelConfig(
            **base, **gemma, sliding_pattern=2,  # type: ignore[arg-type]
            attn_softcap=_num(md, f"{a}.attn_logit_softcapping", where, float, 50.0, positive=True),
            final_softcap=_num(md, f"{a}.final_logit_softcapping", where, float, 30.0, positive=True),
        )
    return ModelConfig(**base, **gemma, rope_base_local=10000.0, qk_norm=True, sliding_pattern=6)  # type: ignore[arg-type]
