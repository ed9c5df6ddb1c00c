"""Causal (optionally sliding-window) attention straight over a lane's paged KV blocks.

One numba kernel for prefill and decode: each (query row, head) is computed by the same loop in
the same order whatever the batch, so a prefill row, a serial step and a batched step agree bit
for bit. K/V are read in place from the pool through the lane's block table (no gather copy).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from engine.parallel import launch


@njit(parallel=True, fastmath=True, cache=True)
def _paged_attention(
    q: np.ndarray,  # [T, H, D] f32, rows at absolute positions start..start+T-1
    k_pool: np.ndarray,  # [blocks, bt, KVH, D] (one layer of the pool)
    v_pool: np.ndarray,
    table: np.ndarray,  # int64 block ids of this lane, in position order
    start: int,
    window: int,  # 0 = unbounded
    scale: float,
    softcap: float,  # 0 = off
    out: np.ndarray,  # [T, H, D]
) -> None:  # pragma: no cover - numba
    t_rows, n_heads, dim = q.shape
    bt = k_pool.shape[1]
    group = n_heads // k_pool.shape[2]
    for th in prange(t_rows * n_heads):
        t = th // n_heads
        h = th % n_heads
        kh = h // group
        pos = start + t
        lo = 0
        if window > 0 and pos - window + 1 > 0:
            lo = pos - window + 1
        n = pos - lo + 1
        s = np.empty(n, dtype=np.float32)
        m = np.float32(-np.inf)
        for j in range(n):
            p = lo + j
            b = table[p // bt]
            off = p % bt
            acc = np.float32(0.0)
            for d in range(dim):
                acc += q[t, h, d] * k_pool[b, off, kh, d]
            acc = acc * np.float32(scale)
            if softcap > 0.0:
                acc = np.float32(softcap) * np.tanh(acc / np.float32(softcap))
            s[j] = acc
            if acc > m:
                m = acc
        tot = np.float32(0.0)
        for j in range(n):
            e = np.exp(s[j] - m)
            s[j] = e
            tot += e
        inv = np.float32(1.0) / tot
        for d in range(dim):
            out[t, h, d] = 0.0
        for j in range(n):
            p = lo + j
            b = table[p // bt]
            off = p % bt
            w = s[j] * inv
            for d in range(dim):
                out[t, h, d] += w * v_pool[b, off, kh, d]


def paged_attention(
    q: np.ndarray,
    k_pool: np.ndarray,
    v_pool: np.ndarray,
    blocks: list[int],
    start: int,
    window: int = 0,
    scale: float | None = None,
    softcap: float = 0.0,
) -> np.ndarray:
    """q [T, H, D] at positions start.. -> attention output [T, H, D] over positions 0..start+T-1."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    out = np.empty_like(q)
    table = np.asarray(blocks, dtype=np.int64)
    t_rows, n_heads, dim = q.shape
    span = start + t_rows if window <= 0 else min(start + t_rows, window)
    launch(_paged_attention, 2 * t_rows * n_heads * dim * span, np.ascontiguousarray(q), k_pool, v_pool, table,
           int(start), int(window), float(scale), float(softcap), out)
    return out


def reference_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int, window: int, scale: float,
                        softcap: float = 0.0) -> np.ndarray:
    """Slow obvious reference on contiguous K/V [L, KVH, D] (float64 internally), for tests."""
    t_rows, n_heads, _ = q.shape
    group = n_heads // k.shape[1]
    out = np.zeros(q.shape, dtype=np.float64)
    for t in range(t_rows):
        pos = start + t
        lo = max(0, pos - window + 1) if window > 0 else 0
        for h in range(n_heads):
            kk = k[lo : pos + 1, h // group].astype(np.float64)
            s = kk @ q[t, h].astype(np.float64) * scale
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            p = np.exp(s - s.max())
            p /= p.sum()
            out[t, h] = p @ v[lo : pos + 1, h // group].astype(np.float64)
    return out.astype(np.float32)
