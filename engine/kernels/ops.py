"""Row-wise numeric ops of the forward pass (RMSNorm, gated activations, RoPE).

Each row is computed by its own loop, so a row's result never depends on how many rows are in
the batch (step_batch == serial step, bit for bit). Plain numpy references live next to them.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from engine.gguf.config import ROPE_NEOX
from engine.kernels.blockdot import dot_f32
from engine.kernels.parallel import ORDERED_FASTMATH, launch


@njit(inline="always", cache=True)
def _norm_scale(xa, n, eps):  # type: ignore[no-untyped-def]
    """rsqrt(mean(x^2) + eps) of the contiguous float32 row at address xa (n values): one fixed summation
    order (dot_f32), so a serial twin, a parallel kernel and the fused kernels below agree."""
    ss = dot_f32(xa, xa, n)
    return np.float32(1.0) / np.sqrt(ss / np.float32(n) + np.float32(eps))


@njit(parallel=True, nogil=True, fastmath=ORDERED_FASTMATH, error_model="numpy", cache=True)
def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float, out: np.ndarray) -> None:  # pragma: no cover
    rows, n = x.shape
    if x.strides[1] != 4:
        raise ValueError("rmsnorm: rows must be contiguous float32")  # dot_f32 reads raw addresses
    xa, xs = np.uint64(x.ctypes.data), np.uint64(x.strides[0])
    for r in prange(rows):
        xr, orow = x[r], out[r]
        inv = _norm_scale(xa + np.uint64(r) * xs, n, eps)
        for i in range(n):
            ui = np.uint64(i)
            orow[ui] = (xr[ui] * inv) * w[ui]


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


@intrinsic
def _pow2i(typingctx, n):  # type: ignore[no-untyped-def]
    """2.0 ** n as float32 for an int32 n in [-126, 127]: the exponent bits, set directly."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        i32 = ir.IntType(32)
        bits = builder.shl(builder.add(args[0], ir.Constant(i32, 127)), ir.Constant(i32, 23))
        return builder.bitcast(bits, ir.FloatType())

    return types.float32(types.int32), codegen


@njit(inline="always", cache=True)
def _exp32(t: float) -> float:  # pragma: no cover - numba
    """exp for float32 in plain arithmetic, so loops over it vectorise (libm's expf is a scalar call
    of ~10 ns per element): t = n ln2 + r (Cody-Waite), e^r by its degree-6 Taylor polynomial
    (|r| <= ln2/2: truncation < 1.3e-8 relative), times 2^n from the exponent bits; a few ulp.
    Clamped to [-87, 88]: below, the result is ~1e-38 instead of a denormal; above, 1.65e38."""
    t = np.float32(88.0) if t > np.float32(88.0) else t
    t = np.float32(-87.0) if t < np.float32(-87.0) else t
    ni = np.int32(t * np.float32(1.44269504088896341) + np.float32(128.5)) - np.int32(128)  # floor(t/ln2 + 0.5):
    n = np.float32(ni)  # truncation of a positive value (np.floor is a libm call that stops vectorisation)
    r = t - n * np.float32(0.693145751953125) - n * np.float32(1.42860682030941723e-06)
    p = np.float32(1.0 / 720.0) * r + np.float32(1.0 / 120.0)
    p = p * r + np.float32(1.0 / 24.0)
    p = p * r + np.float32(1.0 / 6.0)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    return p * _pow2i(ni)


@njit(parallel=True, nogil=True, fastmath=True, error_model="numpy", cache=True)
def _gated(g: np.ndarray, g0: int, u: np.ndarray, u0: int, gelu: bool, out: np.ndarray) -> None:  # pragma: no cover
    """out = act(g[:, g0:g0 + n]) * u[:, u0:u0 + n], n = out.shape[1]: the gate and up columns may be two
    ranges of one array (the fused gate+up product's output), read in place.
    (error_model="numpy": python's raises a ZeroDivisionError check in every division, which keeps
    the loop scalar.) gelu_tanh(x) = 0.5 x (1 + tanh z) = x / (1 + exp(-2z)), z = sqrt(2/pi) (x + 0.044715 x^3): the
    second form has no cancellation in the left tail (1 + tanh z for z << 0) and one vectorisable
    exp; silu(x) = x / (1 + exp(-x))."""
    rows, n = out.shape
    k = np.float32(-2.0 * math.sqrt(2.0 / math.pi)) if gelu else np.float32(-1.0)
    cubic = np.float32(0.044715) if gelu else np.float32(0.0)
    gs, us = np.uint64(g0), np.uint64(u0)
    for r in prange(rows):
        gr, ur, orow = g[r], u[r], out[r]
        for i in range(n):
            ui = np.uint64(i)  # unsigned: no negative-index fix-up, so the serial twin vectorises too
            x = gr[gs + ui]
            orow[ui] = x / (np.float32(1.0) + _exp32(k * (x + cubic * x * x * x))) * ur[us + ui]


def gated_act(g: np.ndarray, u: np.ndarray, act: str) -> np.ndarray:
    """act(gate) * up with act = silu or gelu (tanh approximation)."""
    out = np.empty(g.shape, np.float32)
    (yg, g0), (yu, u0) = row_columns(g), row_columns(u)
    launch(_gated, 16 * g.size, yg, g0, yu, u0, act == "gelu_tanh", out)
    return out


def row_columns(a: np.ndarray) -> tuple[np.ndarray, int]:
    """a float32 [rows, n] as (y, c): a C-contiguous y [rows, >= c + n] with a == y[:, c:c + n]. The fused
    gate+up product's two outputs are column ranges of one array, and copying them out cost more than the
    activation itself (80 rows of Qwen 2.5 0.5B: 0.53 of 0.73 ms). Anything else is copied."""
    base = a.base
    if a.flags.c_contiguous or not isinstance(base, np.ndarray):
        return np.ascontiguousarray(a, dtype=np.float32), 0
    off = a.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    if (a.dtype == base.dtype == np.float32 and base.ndim == 2 and base.flags.c_contiguous
            and base.shape[0] == a.shape[0] and base.strides == a.strides and 0 <= off < base.strides[0]
            and off % 4 == 0 and off // 4 + a.shape[1] <= base.shape[1]):
        return base, off // 4
    return np.ascontiguousarray(a, dtype=np.float32), 0


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


@njit(inline="always", cache=True)
def _rotate(src, cos, sin, half, neox, dst):  # type: ignore[no-untyped-def]
    """One head rotated by RoPE into dst (may be src itself: each pair is read before it is written).
    No `contract` in any caller: the same float32 ops as the numpy reference."""
    for i in range(half):
        ia, ib = (i, i + half) if neox else (2 * i, 2 * i + 1)
        a, b = src[ia], src[ib]
        c, s = cos[i], sin[i]
        dst[ia] = a * c - b * s
        dst[ib] = b * c + a * s


@njit(parallel=True, nogil=True, cache=True)
def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool, out: np.ndarray) -> None:  # pragma: no cover
    t_rows, heads, dim = x.shape
    half = dim // 2
    for th in prange(t_rows * heads):
        t, h = th // heads, th % heads
        _rotate(x[t, h], cos[t], sin[t], half, neox, out[t, h])


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, style: str) -> np.ndarray:
    """Rotate x [T, H, D]: NEOX pairs (i, i + D/2), NORM pairs (2i, 2i + 1). Elementwise, so row-stable.
    One kernel call (the numpy form was ~10 array operations, ~28 us a call at decode)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 3 or x.shape[2] % 2 or cos.shape != (x.shape[0], x.shape[2] // 2) or sin.shape != cos.shape:
        # the kernel reads unchecked
        raise ValueError(f"apply_rope: x {x.shape} does not match cos {cos.shape} / sin {sin.shape}")
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


# ---- fused glue of a block: fewer kernel calls per layer, the same bits as the ops above --------------
# Why: a decode step of Gemma 3 270M made ~110 rmsnorm, 36 rope and 36 add calls, each a few microseconds
# of dispatch for a row of 640 values. These kernels do each run of them in one call. They compute
# every value with the same float32 operations in the same order as rmsnorm / apply_rope / numpy's add
# (no `contract`: a product followed by an add must round twice, as the separate ops do), so a model
# gives the same bits either way (tests/engine/kernels/test_ops_fused.py).
NO_CONTRACT = {"nnan", "ninf", "nsz"}


@njit(parallel=True, nogil=True, fastmath=NO_CONTRACT, error_model="numpy", cache=True)
def _residual_norm(x, o, post_w, scale, next_w, eps, xout, hout):  # type: ignore[no-untyped-def]
    """xout = x + scale * post_norm(o); hout = next_norm(xout). An empty post_w / next_w: no such norm."""
    rows, n = x.shape
    if (o.shape[0] != rows or o.shape[1] != n or x.strides[1] != 4 or o.strides[1] != 4 or xout.strides[1] != 4
            or (post_w.shape[0] != 0 and post_w.shape[0] != n) or (next_w.shape[0] != 0 and next_w.shape[0] != n)):
        raise ValueError("residual_norm: shapes do not match")  # the row norms read raw addresses
    oa, os_ = np.uint64(o.ctypes.data), np.uint64(o.strides[0])
    xa, xs = np.uint64(xout.ctypes.data), np.uint64(xout.strides[0])
    post, nxt, scaled = post_w.shape[0] != 0, next_w.shape[0] != 0, scale != np.float32(1.0)
    for r in prange(rows):
        orow, xr, xo = o[r], x[r], xout[r]
        inv = _norm_scale(oa + np.uint64(r) * os_, n, eps) if post else np.float32(1.0)
        for i in range(n):
            ui = np.uint64(i)
            t = (orow[ui] * inv) * post_w[ui] if post else orow[ui]
            if scaled:
                t = t * scale
            xo[ui] = xr[ui] + t
        if nxt:
            inv2 = _norm_scale(xa + np.uint64(r) * xs, n, eps)
            hr = hout[r]
            for i in range(n):
                ui = np.uint64(i)
                hr[ui] = (xo[ui] * inv2) * next_w[ui]


_NONE = np.empty(0, np.float32)


def residual_norm(x: np.ndarray, o: np.ndarray, post_w: np.ndarray | None, scale: float, next_w: np.ndarray | None,
                  eps: float) -> tuple[np.ndarray, np.ndarray]:
    """The residual update of a block and the next norm in one call: x + scale * rmsnorm(o, post_w) (no norm
    when post_w is None) and rmsnorm of that with next_w (the sum itself when next_w is None)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    o = np.ascontiguousarray(o, dtype=np.float32)
    xout = np.empty_like(x)
    hout = np.empty_like(x) if next_w is not None else xout
    launch(_residual_norm, 2 * x.size, x, o, _NONE if post_w is None else post_w, np.float32(scale),
           _NONE if next_w is None else next_w, float(eps), xout, hout)
    return xout, hout


@njit(parallel=True, nogil=True, fastmath=NO_CONTRACT, error_model="numpy", cache=True)
def _qkv_prep(q, k, v, bq, bk, bv, q_norm, k_norm, cos, sin, rope, neox, eps, qo, ko, vo):  # type: ignore[no-untyped-def]
    """Per row: + bias (empty: none), RMSNorm of each head (empty weight: none), RoPE (rope), into the
    contiguous [rows, heads, dim] outputs qo, ko, vo (v gets its bias only)."""
    rows, n_heads, dim = qo.shape
    kvh = ko.shape[1]
    half = dim // 2
    if (q.shape[0] != rows or q.shape[1] != n_heads * dim or k.shape[1] != kvh * dim or v.shape[1] != kvh * dim
            or qo.strides[2] != 4 or ko.strides[2] != 4 or (rope and (cos.shape[0] != rows or cos.shape[1] != half))):
        raise ValueError("qkv_prep: shapes do not match")
    qa, ka = np.uint64(qo.ctypes.data), np.uint64(ko.ctypes.data)
    for r in prange(rows):
        for h in range(n_heads + kvh):
            is_q = h < n_heads
            hh = h if is_q else h - n_heads
            src = q[r] if is_q else k[r]
            dst = qo[r, hh] if is_q else ko[r, hh]
            bias = bq if is_q else bk
            nw = q_norm if is_q else k_norm
            o0 = hh * dim
            for i in range(dim):
                val = src[o0 + i]
                if bias.shape[0] != 0:
                    val = val + bias[o0 + i]
                dst[i] = val
            if nw.shape[0] != 0:
                base = qa + np.uint64(((r * n_heads) + hh) * dim * 4) if is_q else ka + np.uint64(((r * kvh) + hh) * dim * 4)
                inv = _norm_scale(base, dim, eps)
                for i in range(dim):
                    dst[i] = (dst[i] * inv) * nw[i]
            if rope:
                _rotate(dst, cos[r], sin[r], half, neox, dst)
        for h in range(kvh):
            for i in range(dim):
                val = v[r, h * dim + i]
                if bv.shape[0] != 0:
                    val = val + bv[h * dim + i]
                vo[r, h, i] = val


def qkv_prep(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_heads: int, n_kv: int, dim: int,
             bias: tuple[np.ndarray | None, ...], norms: tuple[np.ndarray | None, np.ndarray | None], eps: float,
             rope: tuple[np.ndarray, np.ndarray, str] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q [rows, H*D], k, v [rows, KVH*D] -> contiguous [rows, heads, D]: + bias, per-head RMSNorm of q and k,
    RoPE of q and k (rope = (cos, sin, style); None: none). One call for what was up to ten."""
    rows = q.shape[0]
    qo = np.empty((rows, n_heads, dim), np.float32)
    ko = np.empty((rows, n_kv, dim), np.float32)
    vo = np.empty((rows, n_kv, dim), np.float32)
    b = [_NONE if x is None else x for x in bias]
    nq, nk = (_NONE if x is None else x for x in norms)
    cos, sin, neox = (rope[0], rope[1], rope[2] == ROPE_NEOX) if rope is not None else (_NO_TABLE, _NO_TABLE, False)
    launch(_qkv_prep, 8 * qo.size, np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v),
           b[0], b[1], b[2], nq, nk, np.ascontiguousarray(cos), np.ascontiguousarray(sin), rope is not None, neox,
           float(eps), qo, ko, vo)
    return qo, ko, vo


_NO_TABLE = np.empty((0, 0), np.float32)
