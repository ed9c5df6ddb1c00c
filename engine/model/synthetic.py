"""A deterministic synthetic checkpoint: the engine runs with no model file and tests reproduce.

Vocab 256 (one token per byte), hidden 64, 3 layers, 4 heads, 2 KV heads (GQA), head_dim 16,
gemma3-like features so every code path runs: per-head q/k norms, post-attention/post-FFN norms,
GELU(tanh) gating, scaled embeddings, a sliding window of 32 on layers 0 and 1 (layer 2 global)
with its own RoPE base, tied LM head. Fixed seed; weights scaled so greedy decoding is peaked.
"""

from __future__ import annotations

import math

import numpy as np

from engine.gguf.config import ROPE_NEOX, ModelConfig
from engine.gguf.identity import config_identity
from engine.model.forward import LayerWeights, Model, Weights

SEED = 20260101

SYNTHETIC_CONFIG = ModelConfig(
    arch="gemma3",
    vocab_size=256,
    hidden=64,
    n_layers=3,
    n_heads=4,
    n_kv_heads=2,
    head_dim=16,
    ffn=128,
    norm_eps=1e-6,
    rope_base=1_000_000.0,
    rope_style=ROPE_NEOX,
    rope_base_local=10_000.0,
    qk_norm=True,
    post_norms=True,
    act="gelu_tanh",
    embed_scale=math.sqrt(64),
    sliding_window=32,
    sliding_pattern=3,
    tied_embeddings=True,
    context_length=4096,
    bos_id=None,
    eos_id=None,
)


def synthetic_weights(config: ModelConfig = SYNTHETIC_CONFIG, seed: int = SEED) -> Weights:
    rng = np.random.default_rng(seed)
    c = config

    def mat(out: int, inp: int) -> np.ndarray:
        return (rng.standard_normal((out, inp)) / math.sqrt(inp)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    layers = []
    for _ in range(c.n_layers):
        layers.append(
            LayerWeights(
                attn_norm=norm(c.hidden),
                wq=mat(c.q_dim, c.hidden),
                wk=mat(c.kv_dim, c.hidden),
                wv=mat(c.kv_dim, c.hidden),
                wo=mat(c.hidden, c.q_dim),
                ffn_norm=norm(c.hidden),
                w_gate=mat(c.ffn, c.hidden),
                w_up=mat(c.ffn, c.hidden),
                w_down=mat(c.hidden, c.ffn),
                q_norm=norm(c.head_dim) if c.qk_norm else None,
                k_norm=norm(c.head_dim) if c.qk_norm else None,
                post_attn_norm=norm(c.hidden) if c.post_norms else None,
                post_ffn_norm=norm(c.hidden) if c.post_norms else None,
            )
        )
    # Embedding rows of norm ~1 after the sqrt(hidden) scale keep the residual stream O(1);
    # the tied head then sees logits with a spread of a few units (peaked, no ties).
    embd = (rng.standard_normal((c.vocab_size, c.hidden)) / c.hidden).astype(np.float32) * 12.0
    return Weights(token_embd=embd, layers=layers, output_norm=norm(c.hidden), output=embd)


def synthetic_model(seed: int = SEED) -> Model:
    """The synthetic checkpoint (same seed -> same weights, bit for bit)."""
    return Model(SYNTHETIC_CONFIG, synthetic_weights(SYNTHETIC_CONFIG, seed), name="synthetic",
                 identity=config_identity(SYNTHETIC_CONFIG, f"synthetic:seed={seed}"))


def synthetic_resident_model(seed: int = SEED) -> Model:
    """The synthetic checkpoint with every matrix but the embedding resident as Q8_0 tiles (Q/K/V and
    gate/up fused, as the loader does): what warms the quantized decode kernels without a model file."""
    from gguf import GGMLQuantizationType as QT

    from engine.model.fuse import fuse_siblings
    from engine.model.resident import resident_weight
    from engine.quant.quantize import quantize_as

    m = synthetic_model(seed)
    for li, lw in enumerate(m.weights.layers):
        for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
            w = getattr(lw, name)
            setattr(lw, name, resident_weight(f"blk.{li}.{name}", QT.Q8_0, quantize_as(QT.Q8_0, w), w.shape))
        fuse_siblings((lw.wq, lw.wk, lw.wv))
        fuse_siblings((lw.w_gate, lw.w_up))
    return m
