"""The single-lane decode step's layers in one kernel (engine/kernels/lane_kernel.py): what it needs from a model.

`LanePlan.of(model)` packs what the kernel reads once per model: every product's tile buffer address and
shape in forward order (fused groups as matmul_group runs them), the per-layer norms and biases stacked
into arrays, the windows and RoPE choices. `plan.run(...)` takes one row through a band of layers. A
model the kernel does not cover (plain float32 or block-layout weights, MoE layers, olmo2's whole-
projection q/k norms, a block without its input norms, one thread) gets None and keeps the generic
forward. FAK_LANE_KERNEL=0 turns it off (A/B and tests).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from engine.errors import EngineError
from engine.gguf.config import ROPE_NEOX
from engine.kernels.attention import chunk_positions
from engine.kernels.lane_kernel import ACT, ATT, HEAD_PHASES, KO, P_ROWS, PHASES_PER_LAYER, QO, VO, D, G, H, O, Q, X, lane_layers
from engine.kernels.ops import rope_tables
from engine.kernels.tasks import LINE
from engine.model.fuse import product_runs
from engine.model.resident import QuantWeight
from engine.quant.tiles import FLOAT_KINDS

TASK_BYTES = 16 << 10  # the smallest claim of a product phase (guided chunks: lane_kernel._products)


def _runs(ws: Sequence[Any]) -> list[QuantWeight] | None:
    """The products matmul_group makes for ws (fuse.product_runs); None if any is not a tiled resident weight."""
    out = [w for w, _ in product_runs(ws)]
    return out if all(isinstance(w, QuantWeight) and w._tile >= 0 for w in out) else None


# the per-layer vectors the kernel reads, in lane_layers' argument order
NORMS = ("attn_norm", "ffn_norm", "post_attn_norm", "post_ffn_norm", "bq", "bk", "bv", "q_norm", "k_norm")


def _stack(vs: list[np.ndarray | None]) -> np.ndarray | None:
    """Per-layer vectors as one [layers, n] array; [layers, 0] when no layer has one; None when some
    layers have one and some do not (not covered)."""
    if all(v is None for v in vs):
        return np.zeros((len(vs), 0), np.float32)
    if any(v is None for v in vs):
        return None
    return np.ascontiguousarray(np.stack([np.asarray(v, np.float32) for v in vs]))


@dataclass
class LanePlan:
    prods: np.ndarray  # [P, 9] int64 (lane_kernel.P_* columns)
    layer_prods: np.ndarray  # [layers, 6] int64
    offs: np.ndarray  # [11] int64 buffer offsets
    dims: np.ndarray  # hidden, heads, kv heads, head_dim, ffn
    size: int  # floats in buf
    norms: tuple[np.ndarray, ...]  # the NORMS vectors, each stacked [layers, n]
    rope_on: np.ndarray  # [layers] bool (key_of != 0)
    windows: np.ndarray  # [layers] int64
    keys: list[tuple[float, float]]  # the distinct (rope theta, position scale) pairs
    key_of: np.ndarray  # [layers] int64: 1 + the layer's index into keys, 0 for a layer without RoPE
    keep: list[Any]  # the weights whose buffers the prods point into (alive while the plan is)
    layers: list[Any]  # the layer objects it was built from: a stage that drops or swaps one rebuilds it
    head: int  # the LM head's index in prods (-1: the head is not a tiled weight; Model.finish runs it)
    out_norm: np.ndarray  # the output norm's weight, float32
    threads: int | None = None  # the team size asked for (tests); None: numba's thread count
    last_counters: np.ndarray | None = None

    @property
    def _zero_row(self) -> np.ndarray:
        return np.zeros((1, int(self.dims[3]) // 2), np.float32)

    def current(self, model: Any) -> bool:
        ls = model.weights.layers
        return len(ls) == len(self.layers) and all(a is b for a, b in zip(ls, self.layers, strict=False))

    @classmethod
    def of(cls, model: Any) -> LanePlan | None:
        c, w = model.config, model.weights
        if os.environ.get("FAK_LANE_KERNEL", "1") == "0" or numba.config.NUMBA_NUM_THREADS < 2:
            return None
        layers = w.layers
        if (c.qk_norm_full or not layers or any(lw is None or lw.moe is not None or lw.attn_norm is None
                                                 or lw.ffn_norm is None for lw in layers)):
            return None
        hidden, q_dim, kv_dim, ffn = c.hidden, c.q_dim, c.kv_dim, c.ffn
        sizes = {X: hidden, H: hidden, Q: q_dim + 2 * kv_dim, QO: q_dim, KO: kv_dim, VO: kv_dim, ATT: q_dim,
                 O: hidden, G: 2 * ffn, ACT: ffn, D: hidden}
        offs = np.zeros(11, np.int64)
        at = 0
        for k in range(11):
            offs[k] = at
            at += -(-sizes[k] // 16) * 16  # 64-byte aligned regions
        prods: list[list[int]] = []
        layer_prods: list[list[int]] = []
        keep: list[Any] = []

        def add(ws: Sequence[Any], in_off: int, n_in: int, out_off: int, want_rows: Sequence[int]) -> tuple[int, int] | None:
            run = _runs(ws)
            if run is None or any(x.shape[1] != n_in for x in run):
                return None
            if [x.shape[0] for x in ws] != list(want_rows):
                return None
            a = len(prods)
            o = out_off
            for x in run:
                prods.append([x._tile, x.raw.ctypes.data, x.raw.shape[0], x.raw.strides[0], n_in, x.shape[0], in_off, o,
                              max(1, TASK_BYTES // x.raw.strides[0])])
                keep.append(x)
                o += x.shape[0]
            return a, len(prods)

        for lw in layers:
            qkv = add((lw.wq, lw.wk, lw.wv), offs[H], hidden, offs[Q], (q_dim, kv_dim, kv_dim))
            o = add((lw.wo,), offs[ATT], q_dim, offs[O], (hidden,))
            gu = add((lw.w_gate, lw.w_up), offs[H], hidden, offs[G], (ffn, ffn))
            dn = add((lw.w_down,), offs[ACT], ffn, offs[D], (hidden,))
            if qkv is None or o is None or gu is None or dn is None:
                return None
            kinds = {prods[i][0] for i in range(*qkv)}, {prods[i][0] for i in range(*gu)}
            if any(len({k >= FLOAT_KINDS for k in ks}) > 1 for ks in kinds):  # one input: all int or all float tiles
                return None
            layer_prods.append([qkv[0], qkv[1], o[0], gu[0], gu[1], dn[0]])
        head = -1
        out = w.output
        if (isinstance(out, QuantWeight) and w.output_norm is not None
                and add((out,), offs[H], hidden, 0, (out.shape[0],)) is not None):
            head = len(prods) - 1
        norms = tuple(_stack([getattr(lw, name) for lw in layers]) for name in NORMS)
        if any(v is None for v in norms):
            return None
        n = len(layers)
        keys: list[tuple[float, float]] = []
        key_of = []
        for li in range(n):
            key = (c.rope_theta(li), c.rope_pos_scale(li))
            if key not in keys:
                keys.append(key)
            key_of.append(1 + keys.index(key) if c.uses_rope(li) else 0)
        return cls(np.array(prods, np.int64), np.array(layer_prods, np.int64), offs,
                   np.array([hidden, c.n_heads, c.n_kv_heads, c.head_dim, ffn], np.int64), at, norms,
                   np.array(key_of, np.int64) != 0,
                   np.array([c.window(li) for li in range(n)], np.int64),
                   keys, np.array(key_of, np.int64), keep, list(layers), head,
                   np.ascontiguousarray(w.output_norm if w.output_norm is not None else np.zeros(0), np.float32))

    def run(self, model: Any, x: np.ndarray, lane: Any, lo: int, hi: int, kv_layer0: int,
            stamps: np.ndarray | None = None, head: bool = False) -> np.ndarray:
        """Layers lo..hi-1 on one decode row x [1, hidden] of `lane` (its KV block reserved); the new x,
        or with head=True (the plan has one: self.head >= 0) the logits [1, vocab] after the output norm and
        the LM head (before any logit scale or softcap). stamps: int64 [2 + PHASES_PER_LAYER * (hi - lo)
        (+ HEAD_PHASES)] to receive the cycle counter per phase."""
        c = model.config
        pos = int(lane.start)
        pool = lane.kv.pool
        bt = pool.block_tokens
        blocks = lane.kv.blocks
        if pos < 0 or pos // bt >= len(blocks):
            raise EngineError(f"attention: lane 0 has {len(blocks)} KV blocks of {bt} tokens, "
                              f"position {pos} needs {pos // bt + 1}")
        table = np.asarray(blocks, dtype=np.int64)
        # one cos/sin row per distinct RoPE (base, scale) (Gemma 3: local and global), gathered per layer;
        # row 0 of the gather is zeros for the layers without RoPE
        positions = np.array([pos], np.int64)
        rows = [rope_tables(positions, theta, c.head_dim, ps, model.weights.rope_freqs) for theta, ps in self.keys]
        cos = np.concatenate([self._zero_row] + [r[0] for r in rows])[self.key_of]
        sin = np.concatenate([self._zero_row] + [r[1] for r in rows])[self.key_of]
        chunk = chunk_positions(c.head_dim)
        maxch = pos // chunk + 2
        kvh, group = c.n_kv_heads, c.n_heads // c.n_kv_heads
        part_m = np.empty((maxch, kvh, group), np.float32)
        part_l = np.empty((maxch, kvh, group), np.float32)
        part_o = np.empty((maxch, kvh, group, c.head_dim), np.float32)
        buf = np.empty(self.size, np.float32)
        buf[self.offs[X]:self.offs[X] + c.hidden] = x[0]
        head = head and self.head >= 0
        logits = np.empty(int(self.prods[self.head, P_ROWS]), np.float32) if head else _NONE1
        ctr = np.zeros((1 + PHASES_PER_LAYER * (hi - lo) + HEAD_PHASES * head) * LINE, np.int64)
        an, fn, pa, pf, bq, bk, bv, qn, kn = self.norms
        lane_layers(self.threads or numba.get_num_threads(), lo, hi, kv_layer0, self.prods, self.layer_prods, buf, self.offs,
                    self.dims,
                    an, fn, pa, pf, bq, bk, bv, qn, kn, cos, sin, self.rope_on, c.rope_style == ROPE_NEOX,
                    self.windows, float(c.norm_eps), float(c.scale), np.float32(c.residual_scale), float(c.attn_softcap),
                    c.act == "gelu_tanh", pool.k, pool.v, table, pos, int(table[pos // bt]), pos % bt, chunk,
                    part_m, part_l, part_o, ctr, _NONE1, _NO_STAMPS if stamps is None else stamps,
                    self.head if head else -1, self.out_norm, logits)
        self.last_counters = ctr  # the phases' counters (tests read who claimed what)
        if head:
            return logits.reshape(1, -1)
        return buf[self.offs[X]:self.offs[X] + c.hidden].reshape(1, c.hidden).copy()


_NONE1 = np.empty(0, np.float32)
_NO_STAMPS = np.empty(0, np.int64)
