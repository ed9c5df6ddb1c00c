"""The fused glue of a block (ops.residual_norm, ops.qkv_prep) gives the bits of the separate ops it replaces,
and its serial twin the bits of the parallel kernel."""

from __future__ import annotations

import numpy as np
import pytest

from engine.gguf.config import ROPE_NEOX, ROPE_NORM
from engine.kernels import ops
from engine.kernels.parallel import serial_twin

RNG = np.random.default_rng(3)


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("rows", [1, 5, 300])
@pytest.mark.parametrize("post,scale,nxt", [(True, 1.0, True), (False, 1.0, True), (True, 0.22, False),
                                            (False, 0.5, False)])
def test_residual_norm_is_add_then_norms(rows: int, post: bool, scale: float, nxt: bool) -> None:
    n = 640
    x, o = _f32(rows, n), _f32(rows, n) * 3
    pw, nw = 1 + 0.1 * _f32(n), 1 + 0.1 * _f32(n)
    t = ops.rmsnorm(o, pw, 1e-6) if post else o
    if scale != 1.0:
        t = t * np.float32(scale)
    want_x = x + t
    want_h = ops.rmsnorm(want_x, nw, 1e-6) if nxt else want_x
    got_x, got_h = ops.residual_norm(x, o, pw if post else None, scale, nw if nxt else None, 1e-6)
    assert np.array_equal(got_x, want_x) and np.array_equal(got_h, want_h)
    xo, ho = np.empty_like(x), np.empty_like(x)
    serial_twin(ops._residual_norm)(x, o, pw if post else ops._NONE, np.float32(scale), nw if nxt else ops._NONE,
                                    1e-6, xo, ho)
    assert np.array_equal(xo, got_x) and (not nxt or np.array_equal(ho, got_h))


@pytest.mark.parametrize("rows", [1, 7, 200])
@pytest.mark.parametrize("bias,norm,style", [(False, True, ROPE_NEOX), (True, False, ROPE_NEOX), (True, True, ROPE_NORM),
                                             (False, False, None)])
def test_qkv_prep_is_bias_norm_rope(rows: int, bias: bool, norm: bool, style: str | None) -> None:
    heads, kvh, dim = 6, 2, 64
    q, k, v = _f32(rows, heads * dim), _f32(rows, kvh * dim), _f32(rows, kvh * dim)
    bq, bk, bv = _f32(heads * dim), _f32(kvh * dim), _f32(kvh * dim)
    qn, kn = 1 + 0.1 * _f32(dim), 1 + 0.1 * _f32(dim)
    cos, sin = ops.rope_tables(np.arange(100, 100 + rows), 10000.0, dim)
    wq, wk, wv = (q + bq, k + bk, v + bv) if bias else (q, k, v)
    wq, wk, wv = wq.reshape(rows, heads, dim), wk.reshape(rows, kvh, dim), wv.reshape(rows, kvh, dim)
    if norm:
        wq, wk = ops.rmsnorm(wq, qn, 1e-6), ops.rmsnorm(wk, kn, 1e-6)
    if style is not None:
        wq, wk = ops.apply_rope(wq, cos, sin, style), ops.apply_rope(wk, cos, sin, style)
    got = ops.qkv_prep(q, k, v, heads, kvh, dim, (bq, bk, bv) if bias else (None, None, None),
                       (qn, kn) if norm else (None, None), 1e-6, (cos, sin, style) if style is not None else None)
    for g, w in zip(got, (wq, wk, wv), strict=False):
        assert g.shape == w.shape and np.array_equal(g, w)
    # strided inputs (the column views a fused product returns) give the same bits
    wide = np.concatenate([q, k], axis=1)
    again = ops.qkv_prep(wide[:, : heads * dim], wide[:, heads * dim:], v, heads, kvh, dim,
                         (bq, bk, bv) if bias else (None, None, None), (qn, kn) if norm else (None, None), 1e-6,
                         (cos, sin, style) if style is not None else None)
    assert all(np.array_equal(a, b) for a, b in zip(again, got, strict=False))
