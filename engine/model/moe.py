"""Mixture-of-experts FFN (qwen3moe): a router picks the top-k experts of each row, only theirs are read.

Each expert's gate / up / down is its own matrix (a row band of the GGUF's 3-D `ffn_*_exps` tensor,
plain or resident like any other weight). A forward visits the experts its rows chose in ascending id,
once each, with all the rows that chose it: lanes of a batch that pick the same expert share one read
of it, and each row still sums its experts in the same order (ascending id) alone or batched, with the
row-stable decode products, so a lane's logits are the same bits solo or in a batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.kernels.ops import gated_act
from engine.model.fuse import matmul_group


@dataclass
class Experts:
    router: Any  # [n_experts, hidden] (ffn_gate_inp)
    gate: list[Any]  # per expert [expert_ffn, hidden]
    up: list[Any]
    down: list[Any]  # per expert [hidden, expert_ffn]

    def expert_nbytes(self, e: int) -> int:
        return int(self.gate[e].nbytes) + int(self.up[e].nbytes) + int(self.down[e].nbytes)

    @property
    def nbytes(self) -> int:
        return int(self.router.nbytes) + sum(self.expert_nbytes(e) for e in range(len(self.gate)))


def route(logits: np.ndarray, k: int, renorm: bool) -> tuple[np.ndarray, np.ndarray]:
    """Router logits [rows, n_experts] -> (expert ids [rows, k], weights [rows, k]): softmax over all
    experts, the k largest (ties to the lower id), renormalised to sum 1 if `renorm` (llama.cpp's qwen3moe;
    HF norm_topk_prob)."""
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    top = np.argsort(-p, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(p, top, axis=1)
    if renorm:
        w = w / w.sum(axis=1, keepdims=True)
    return top, w.astype(np.float32)


def moe_ffn(h: np.ndarray, ex: Experts, k: int, renorm: bool, act: str,
            mm: Callable[[np.ndarray, Any], np.ndarray]) -> tuple[np.ndarray, int]:
    """The FFN output [rows, hidden] of normed rows h, and the expert weight bytes it read (router excluded)."""
    top, w = route(mm(h, ex.router), k, renorm)
    out = np.zeros_like(h)
    read = 0
    for e in np.unique(top):  # ascending id: each row's sum has the same order alone or in a batch
        rows, slot = np.nonzero(top == e)
        he = h[rows]
        g, u = matmul_group(he, (ex.gate[e], ex.up[e]), mm)  # one launch when fused at load (engine/model/fuse.py)
        d = mm(gated_act(g, u, act), ex.down[e])
        out[rows] += d * w[rows, slot][:, None]
        read += ex.expert_nbytes(int(e))
    return out, read
