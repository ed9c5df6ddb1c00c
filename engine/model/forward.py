"""The forward pass, one for every architecture: embedding -> blocks -> norm -> head.

A forward call runs a ragged batch of lanes: lane i feeds `n_i` tokens at positions
`start_i..start_i+n_i-1` of its own paged KV cache. Prefill is one lane with many tokens,
step_batch is many lanes with one token each; a scheduler may mix them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.gguf.config import ModelConfig
from engine.gguf.identity import config_identity
from engine.kernels.ops import gated_act, qkv_prep, residual_norm, rmsnorm, rope_tables
from engine.model import linear
from engine.model.attention_groups import attention_groups
from engine.model.fuse import matmul_group
from engine.model.kv import BlockPool, PageTable
from engine.model.lane_step import LanePlan
from engine.model.moe import Experts, moe_ffn
from engine.model.scratch import Scratch


@dataclass
class LayerWeights:
    attn_norm: np.ndarray | None  # None: no pre-norm (olmo2)
    wq: Any
    wk: Any
    wv: Any
    wo: Any
    ffn_norm: np.ndarray | None
    w_gate: Any
    w_up: Any
    w_down: Any
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None
    moe: Experts | None = None  # a MoE layer: router + experts instead of w_gate / w_up / w_down


@dataclass
class Weights:
    token_embd: Any
    layers: list[LayerWeights]
    output_norm: np.ndarray
    output: Any  # the same object as token_embd when tied
    rope_freqs: np.ndarray | None = None  # per-frequency divisors (llama 3 rope_freqs.weight)

    @property
    def nbytes(self) -> int:
        seen: dict[int, int] = {}
        layers = [lw for lw in self.layers if lw is not None]  # a pipeline stage keeps only its band
        for obj in [self.token_embd, self.output_norm, self.output, *[v for lw in layers for v in vars(lw).values()]]:
            if obj is not None:
                seen[id(obj)] = int(obj.nbytes)
        return sum(seen.values())


@dataclass
class LaneInput:
    """One lane of a forward batch: `n` tokens written at positions kv.length.. of `kv`."""

    kv: PageTable
    n: int
    start: int = field(default=-1)
    logits: int = 1  # how many of the lane's last rows get logits (speculative verification: all its rows)

    def __post_init__(self) -> None:
        if self.start < 0:
            self.start = self.kv.length


class Model:
    """Config + weights + the forward pass. `prefill_blas=False` makes prefill use the decode kernels,
    so chunked prefill, one-shot prefill and serial steps then agree bit for bit."""

    def __init__(self, config: ModelConfig, weights: Weights, name: str = "model",
                 tensor_types: dict[str, int] | None = None, identity: bytes | None = None) -> None:
        self.config = config
        self.weights = weights
        self.name = name
        # what a KV transfer frame names (engine.gguf.identity): the GGUF's tensor layout + tokenizer when
        # loaded from a file; else the config and the name, so two differently named checkpoints differ
        self.identity = identity if identity is not None else config_identity(config, name)
        self.tensor_types = tensor_types or {}  # GGUF tensor count per type ("Q4_K": 100, ...): the quant mix
        self.prefill_blas = True
        self.kv_dtype = "f32"  # what new pools store K/V as (engine/kernels/kvtype.py; boot sets --kv-dtype)
        self.expert_bytes_read = 0  # MoE: expert weight bytes the forwards have read (only chosen experts)
        self._lane_plan: LanePlan | None = None
        self._lane_plan_built = False

    def lane_plan(self) -> LanePlan | None:
        """The one-kernel single-lane decode step for this model (engine/model/lane_step.py), or None."""
        p = self._lane_plan
        if not self._lane_plan_built or (p is not None and not p.current(self)):
            p = self._lane_plan = LanePlan.of(self)
            self._lane_plan_built = True
        return p

    def new_pool(self, num_blocks: int | None = None, block_tokens: int = 16) -> BlockPool:
        c = self.config
        return BlockPool(c.n_layers, c.n_kv_heads, c.head_dim, num_blocks=num_blocks, block_tokens=block_tokens,
                         kv_dtype=self.kv_dtype)

    def forward(self, ids: np.ndarray, lanes: list[LaneInput], decode: bool,
                trace: list[np.ndarray] | None = None, all_logits: bool = False, head: bool = True,
                out: Scratch | None = None) -> np.ndarray:
        """Run sum(n) tokens through the model; K/V land in each lane's (already reserved) blocks.

        Returns logits [len(lanes), vocab] of each lane's last token (every row with all_logits); with
        head=False the final hidden state after the output norm instead, [rows, hidden].
        Does not advance kv.length. `trace` collects the residual stream (oracle tests). `out`: the
        buffer the head's logits may be written into (engine/model/scratch.py).
        """
        ids = np.asarray(ids, dtype=np.int64)
        if int(ids.shape[0]) != sum(ln.n for ln in lanes):
            raise ValueError("ids do not match the lanes' token counts")
        x = self.embed_rows(ids)
        if trace is not None:
            trace.append(x.copy())
        if head and trace is None and len(lanes) == 1 and lanes[0].n == 1:  # one decode row: one kernel, head too
            plan = self.lane_plan()
            if plan is not None and plan.head >= 0:
                return self._logit_post(plan.run(self, x, lanes[0], 0, self.config.n_layers, 0, head=True))
        x = self.run_layers(x, lanes, decode, 0, self.config.n_layers, trace=trace)
        return self.finish(x, lanes, all_logits, head, trace, out)

    # The three parts of a forward, so a pipeline can run them in different processes (engine/pipeline/pipeline.py):
    # the embedding and the head where the scheduler is, a band of layers on each stage.
    def embed_rows(self, ids: np.ndarray) -> np.ndarray:
        """The residual stream's first state: token embeddings [rows, hidden] (scaled for gemma)."""
        x = linear.take(self.weights.token_embd, np.asarray(ids, dtype=np.int64))
        if self.config.embed_scale != 1.0:
            x *= np.float32(self.config.embed_scale)
        return x

    def run_layers(self, x: np.ndarray, lanes: list[LaneInput], decode: bool, lo: int, hi: int,
                   kv_layer0: int = 0, trace: list[np.ndarray] | None = None) -> np.ndarray:
        """Layers lo..hi-1 on the residual stream x [rows, hidden]; layer li's K/V go to layer li - kv_layer0
        of each lane's pool (a pipeline stage's pool holds only its own layers)."""
        c, w = self.config, self.weights
        rows = int(x.shape[0])
        if rows == 1 and len(lanes) == 1 and trace is None:  # one decode row: every layer in one kernel
            plan = self.lane_plan()
            if plan is not None:
                return plan.run(self, x, lanes[0], lo, hi, kv_layer0)
        blas = not decode and self.prefill_blas
        mm = linear.matmul_prefill if blas else linear.matmul
        positions = np.concatenate([np.arange(ln.start, ln.start + ln.n) for ln in lanes])
        groups = attention_groups(lanes, blas)
        tables: dict[tuple[float, float], tuple[np.ndarray, np.ndarray]] = {}
        eps, scale = c.norm_eps, c.residual_scale  # granite scales each residual branch
        first = w.layers[lo].attn_norm
        h = rmsnorm(x, first, eps) if first is not None else x
        for li in range(lo, hi):
            lw = w.layers[li]
            key = (c.rope_theta(li), c.rope_pos_scale(li))
            if key not in tables:
                tables[key] = rope_tables(positions, key[0], c.head_dim, key[1], w.rope_freqs)
            cos, sin = tables[key]
            q, k, v = matmul_group(h, (lw.wq, lw.wk, lw.wv), mm)
            norms = (lw.q_norm, lw.k_norm)
            if c.qk_norm_full:  # olmo2: over the whole projection (after the bias), before the split into heads
                q = rmsnorm(q + lw.bq if lw.bq is not None else q, lw.q_norm, eps)
                k = rmsnorm(k + lw.bk if lw.bk is not None else k, lw.k_norm, eps)
                bias, norms = (None, None, lw.bv), (None, None)
            else:
                bias = (lw.bq, lw.bk, lw.bv)
            rope = (cos, sin, c.rope_style) if c.uses_rope(li) else None  # smollm3: every 4th layer has none
            q, k, v = qkv_prep(q, k, v, c.n_heads, c.n_kv_heads, c.head_dim, bias, norms, eps, rope)
            att = np.empty_like(q)
            for g in groups:
                g.attend(li - kv_layer0, q, k, v, att, c.window(li), c.scale, c.attn_softcap)
            o = mm(att.reshape(rows, c.q_dim), lw.wo)
            x, h = residual_norm(x, o, lw.post_attn_norm, scale, lw.ffn_norm, eps)
            if lw.moe is not None:
                d, nb = moe_ffn(h, lw.moe, c.n_experts_used, c.expert_weights_norm, c.act, mm)
                self.expert_bytes_read += nb
            else:
                g_, u_ = matmul_group(h, (lw.w_gate, lw.w_up), mm)
                d = mm(gated_act(g_, u_, c.act), lw.w_down)
            nxt = w.layers[li + 1].attn_norm if li + 1 < hi else None  # the next block's input norm, fused
            x, h = residual_norm(x, d, lw.post_ffn_norm, scale, nxt, eps)
            if trace is not None:
                trace.append(x.copy())
        return x

    def finish(self, x: np.ndarray, lanes: list[LaneInput], all_logits: bool = False, head: bool = True,
               trace: list[np.ndarray] | None = None, out: Scratch | None = None) -> np.ndarray:
        """Output norm of each lane's last row (its last `logits` rows; every row with all_logits), then the LM
        head (head=True)."""
        c, w = self.config, self.weights
        rows = int(x.shape[0])
        if all_logits:
            last = np.arange(rows)
        else:
            ends = np.cumsum([ln.n for ln in lanes])
            last = np.concatenate([np.arange(e - min(ln.logits, ln.n), e) for e, ln in zip(ends, lanes, strict=True)])
        hl = rmsnorm(x[last], w.output_norm, c.norm_eps)
        if trace is not None:
            trace[-1] = hl  # HF reports the final state after the output norm
        if not head:
            return hl
        return self._logit_post(linear.matmul(hl, w.output, out))  # the head always takes the row-stable path

    def _logit_post(self, logits: np.ndarray) -> np.ndarray:
        """The head's output as logits: granite's scale, gemma2's final softcap."""
        c = self.config
        if c.logit_scale != 1.0:  # granite
            logits *= np.float32(1.0 / c.logit_scale)
        if c.final_softcap > 0:
            logits = np.float32(c.final_softcap) * np.tanh(logits / np.float32(c.final_softcap))
        return logits

    def embed(self, ids: list[int] | np.ndarray) -> np.ndarray:
        """A text embedding: the last hidden state (after the output norm) of every position, mean-pooled
        and L2-normalised, float32 [hidden]. Runs in a private pool; the caller's KV is not touched."""
        ids = np.asarray(ids, dtype=np.int64)
        kv = PageTable(self.new_pool(None))
        kv.reserve(len(ids))
        try:
            h = self.forward(ids, [LaneInput(kv, len(ids))], decode=False, all_logits=True, head=False)
        finally:
            kv.free()
        v = h.astype(np.float64).mean(axis=0)
        return (v / max(float(np.linalg.norm(v)), 1e-12)).astype(np.float32)

    def hidden_states(self, ids: list[int] | np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        """For oracle tests: the residual stream [T, hidden] after the embedding and after each block
        (the last one after the output norm, as HF output_hidden_states does) and logits [T, vocab]."""
        ids = np.asarray(ids, dtype=np.int64)
        kv = PageTable(self.new_pool(None))
        kv.reserve(len(ids))
        states: list[np.ndarray] = []
        logits = self.forward(ids, [LaneInput(kv, len(ids))], decode=False, trace=states, all_logits=True)
        kv.free()
        return states, logits
