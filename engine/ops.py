"""Row-wise numeric ops of the forward pass (RMSNorm, gated activations, RoPE).

Each row is computed by its own loop, so a row's result never depends on how many rows are in
the batch (step_batch == serial step, bit for bit). Plain numpy references live next to them.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import njit, prange

from engine.config import ROPE_NEOX
from engine.parallel import launch


@njit(parallel=True, fastmath=True, cache=True)
def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float, out: np.ndarray) -> None:  # pragma: no cover
    rows, n = x.shape
    for r in prange(rows):
        ss = np.float32(0.0)
        for i in range(n):
            ss += x[r, i] * x[r, i]
        inv = np.float32(1.0) / np.sqrt(ss / np.float32(n) + np.float32(eps))
        for i in range(n):
            out[r, i] = (x[r, i] * inv) * w[i]


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x [..., n] * rsqrt(mean(x^2) + eps) * w  (w is the effective multiplier, gemma's +1 included)."""
    shape = x.shape
    x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, shape[-1])
    out = np.empty_like(x2)
    launch(_rmsnorm, x2.size, x2, w, float(eps), out)
    return out.reshape(shape)


def rmsnorm_ref(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    return (x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps) * w).astype(np.float32)


@njit(inline="always", cache=True)
def _tanh32(x: float) -> float:  # pragma: no cover - numba
    """tanh as a [13/6] rational on [-7.9, 7.9] (Eigen's float tanh, a few ulp): mul/add/div and
    selects, so the loop vectorises. glibc's tanhf is a scalar call of ~20 ns per element: with it
    the gelu was ~20% of a Gemma 512-token prefill (23 ms -> 1 ms per layer, measured)."""
    lim = np.float32(7.90531110763549805)
    x = lim if x > lim else x
    x = -lim if x < -lim else x
    x2 = x * x
    p = x2 * np.float32(-2.76076847742355e-16) + np.float32(2.00018790482477e-13)
    p = p * x2 + np.float32(-8.60467152213735e-11)
    p = p * x2 + np.float32(5.12229709037114e-08)
    p = p * x2 + np.float32(1.48572235717979e-05)
    p = p * x2 + np.float32(6.37261928875436e-04)
    p = p * x2 + np.float32(4.89352455891786e-03)
    q = x2 * np.float32(1.19825839466702e-06) + np.float32(1.18534705686654e-04)
    q = q * x2 + np.float32(2.26843463243900e-03)
    q = q * x2 + np.float32(4.89352518554385e-03)
    return (x * p) / q


@njit(parallel=True, cache=True)
def _gated(g: np.ndarray, u: np.ndarray, gelu: bool, out: np.ndarray) -> None:  # pragma: no cover
    rows, n = g.shape
    c = np.float32(math.sqrt(2.0 / math.pi))
    for r in prange(rows):
        if gelu:
            for i in range(n):
                x = g[r, i]
                out[r, i] = np.float32(0.5) * x * (np.float32(1.0) + _tanh32(c * (x + np.float32(0.044715) * x * x * x))) \
                    * u[r, i]
            # far left tail (tanh argument below -7.9: x < ~-4.85): 1 + tanh is smaller than the
            # rational resolves there, so those rare elements take libm's tanh (a compare otherwise)
            lo = g[r, 0]
            for i in range(n):
                lo = min(lo, g[r, i])
            for i in range(n if lo < np.float32(-4.5) else 0):  # (guarded: LLVM would predicate
                x = g[r, i]  # the call and run libm's tanh on every element)
                if x < np.float32(-4.5):
                    out[r, i] = np.float32(0.5) * x * (np.float32(1.0) + np.tanh(c * (x + np.float32(0.044715) * x * x * x))) \
                        * u[r, i]
        else:
            for i in range(n):
                x = g[r, i]
                out[r, i] = x / (np.float32(1.0) + np.exp(-x)) * u[r, i]


def gated_act(g: np.ndarray, u: np.ndarray, act: str) -> np.ndarray:
    """act(gate) * up with act = silu or gelu (tanh approximation)."""
    out = np.empty_like(g)
    launch(_gated, 16 * g.size, np.ascontiguousarray(g), np.ascontiguousarray(u), act == "gelu_tanh", out)
    return out


def gated_act_ref(g: np.ndarray, u: np.ndarray, act: str) -> np.ndarray:
    x = g.astype(np.float64)
    if act == "gelu_tanh":
        a = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    else:
        a = x / (1 + np.exp(-x))
    return (a * u).astype(np.float32)


@lru_cache(maxsize=16)
def _inv_freq(theta: float, dim: int) -> np.ndarray:
    return theta ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)


def rope_tables(positions: np.ndarray, theta: float, dim: int, scale: float = 1.0,
                factors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [T, dim/2] for absolute positions (angles in float64, then float32).

    `factors` (GGUF rope_freqs.weight, llama 3 style) divide each frequency, as in ggml_rope_ext."""
    inv = _inv_freq(float(theta), dim)
    if factors is not None:
        inv = inv / factors.astype(np.float64)
    ang = (positions.astype(np.float64) / scale)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@njit(parallel=True, cache=True)
def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool, out: np.ndarray) -> None:  # pragma: no cover
    t_rows, heads, dim = x.shape
    half = dim // 2
    for th in prange(t_rows * heads):
        t, h = th // heads, th % heads
        for i in range(half):
            ia, ib = (i, i + half) if neox else (2 * i, 2 * i + 1)
            a, b = x[t, h, ia], x[t, h, ib]
            c, s = cos[t, i], sin[t, i]
            out[t, h, ia] = a * c - b * s  # no fastmath: the same float32 ops as the numpy reference
            out[t, h, ib] = b * c + a * s


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, style: str) -> np.ndarray:
    """Rotate x [T, H, D]: NEOX pairs (i, i + D/2), NORM pairs (2i, 2i + 1). Elementwise, so row-stable.
    One kernel call (the numpy form was ~10 array operations, ~28 us a call at decode)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    launch(_rope, 4 * x.size, x, np.ascontiguousarray(cos), np.ascontiguousarray(sin), style == ROPE_NEOX, out)
    return out


def apply_rope_ref(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, style: str) -> np.ndarray:
    """The numpy reference of apply_rope."""
    c, s = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(x)
    if style == ROPE_NEOX:
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        out[..., :half] = a * c - b * s
        out[..., half:] = b * c + a * s
    else:
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = b * c + a * s
    return out
