"""The forward pass and its kernels against slow obvious references (float64, no paging)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from engine import Session, synthetic_model
from engine.gguf.config import ROPE_NEOX, ROPE_NORM, ModelConfig
from engine.kernels.attention import paged_attention, reference_attention
from engine.kernels.ops import (
    apply_rope,
    apply_rope_ref,
    gated_act,
    gated_act_ref,
    rmsnorm,
    rmsnorm_ref,
    rope_tables,
    row_columns,
)
from engine.model.forward import Model
from engine.model.kv import BlockPool, PageTable
from engine.model.linear import matmul_rows


def ref_forward(m: Model, ids: list[int]) -> np.ndarray:
    """Textbook transformer in float64 on contiguous arrays: logits [T, vocab]."""
    c, w = m.config, m.weights
    f = lambda a: np.asarray(a, dtype=np.float64)  # noqa: E731
    T = len(ids)

    def norm(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + c.norm_eps) * f(g)

    def rope(x: np.ndarray, theta: float, li: int) -> np.ndarray:  # x [T, H, D]
        d = c.head_dim
        inv = theta ** (-np.arange(0, d, 2) / d)
        if w.rope_freqs is not None:
            inv = inv / f(w.rope_freqs)
        ang = np.arange(T)[:, None] / c.rope_pos_scale(li) * inv[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        if c.rope_style == ROPE_NEOX:
            a, b = x[..., : d // 2], x[..., d // 2 :]
            return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, b * cos + a * sin
        return out

    x = f(w.token_embd)[ids] * c.embed_scale
    for li, lw in enumerate(w.layers):
        h = norm(x, lw.attn_norm)
        bq, bk, bv = (0.0, 0.0, 0.0) if lw.bq is None else (f(lw.bq), f(lw.bk), f(lw.bv))
        q = (h @ f(lw.wq).T + bq).reshape(T, c.n_heads, c.head_dim)
        k = (h @ f(lw.wk).T + bk).reshape(T, c.n_kv_heads, c.head_dim)
        v = (h @ f(lw.wv).T + bv).reshape(T, c.n_kv_heads, c.head_dim)
        if lw.q_norm is not None:
            q, k = norm(q, lw.q_norm), norm(k, lw.k_norm)
        q, k = rope(q, c.rope_theta(li), li), rope(k, c.rope_theta(li), li)
        rep = c.n_heads // c.n_kv_heads
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) * c.scale
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        mask = j > i
        if c.window(li):
            mask |= (i - j) >= c.window(li)
        s[:, mask] = -np.inf
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", p, v).reshape(T, -1) @ f(lw.wo).T
        if lw.post_attn_norm is not None:
            o = norm(o, lw.post_attn_norm)
        x = x + o
        h = norm(x, lw.ffn_norm)
        g, u = h @ f(lw.w_gate).T, h @ f(lw.w_up).T
        a = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3))) if c.act == "gelu_tanh" else g / (1 + np.exp(-g))
        d = (a * u) @ f(lw.w_down).T
        if lw.post_ffn_norm is not None:
            d = norm(d, lw.post_ffn_norm)
        x = x + d
    return norm(x, w.output_norm) @ f(w.output).T


@pytest.fixture(scope="module")
def model() -> Model:
    return synthetic_model()


def test_synthetic_config(model: Model) -> None:
    c = model.config
    assert (c.vocab_size, c.hidden, c.n_layers, c.n_heads, c.n_kv_heads) == (256, 64, 3, 4, 2)
    assert [c.window(i) for i in range(3)] == [32, 32, 0]


def test_forward_matches_reference_across_sliding_window(model: Model) -> None:
    ids = list(np.random.default_rng(1).integers(0, 256, size=70))  # longer than the window of 32
    ref = ref_forward(model, ids)
    _, logits = model.hidden_states(ids)
    np.testing.assert_allclose(logits, ref, atol=2e-4, rtol=1e-4)
    s = Session(model)
    np.testing.assert_allclose(s.prefill(ids), ref[-1], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("rope_style,qkv_bias,rope_extra", [("norm", True, False), ("neox", False, True)])
def test_llama_like_variant_matches_reference(model: Model, rope_style: str, qkv_bias: bool, rope_extra: bool) -> None:
    # The same weights read as a llama/qwen2-like model: no q/k norms, no post norms, silu, no window;
    # rope_extra adds linear position scaling and llama-3 style per-frequency factors.
    c: ModelConfig = model.config.with_(arch="llama", rope_style=rope_style, qk_norm=False, post_norms=False,
                                        act="silu", embed_scale=1.0, sliding_window=0, rope_base=10000.0,
                                        rope_scale=4.0 if rope_extra else 1.0)
    w = copy.deepcopy(model.weights)
    if rope_extra:
        w.rope_freqs = np.linspace(1.0, 8.0, c.head_dim // 2).astype(np.float32)
    rng = np.random.default_rng(3)
    for lw in w.layers:
        lw.q_norm = lw.k_norm = lw.post_attn_norm = lw.post_ffn_norm = None
        if qkv_bias:
            lw.bq = rng.standard_normal(c.q_dim).astype(np.float32) * 0.1
            lw.bk = rng.standard_normal(c.kv_dim).astype(np.float32) * 0.1
            lw.bv = rng.standard_normal(c.kv_dim).astype(np.float32) * 0.1
    m = Model(c, w)
    ids = list(b"variant check, twenty-some tokens")
    ref = ref_forward(m, ids)
    _, logits = m.hidden_states(ids)
    np.testing.assert_allclose(logits, ref, atol=2e-4, rtol=1e-4)


def test_matmul_rows_is_row_stable_and_correct() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((300, 640)).astype(np.float32)
    x = rng.standard_normal((7, 640)).astype(np.float32)
    full = matmul_rows(x, w)
    np.testing.assert_allclose(full, x.astype(np.float64) @ w.T.astype(np.float64), atol=1e-3, rtol=1e-4)
    for b in range(7):
        assert np.array_equal(matmul_rows(x[b : b + 1], w)[0], full[b])
        assert np.array_equal(matmul_rows(x[b:], w)[0], full[b])


def test_ops_match_references() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 130)).astype(np.float32) * 3
    g = rng.standard_normal(130).astype(np.float32)
    np.testing.assert_allclose(rmsnorm(x, g, 1e-6), rmsnorm_ref(x, g, 1e-6), rtol=1e-5, atol=1e-6)
    u = rng.standard_normal((5, 130)).astype(np.float32)
    for act in ("silu", "gelu_tanh"):
        np.testing.assert_allclose(gated_act(x, u, act), gated_act_ref(x, u, act), rtol=1e-5, atol=1e-6)
        assert np.array_equal(gated_act(x[2:3], u[2:3], act)[0], gated_act(x, u, act)[2])
    assert np.array_equal(rmsnorm(x[3:4], g, 1e-6)[0], rmsnorm(x, g, 1e-6)[3])


def test_gated_act_reads_column_ranges_of_one_array_in_place() -> None:
    """The fused gate+up product returns two column views of one array: read where they are, same bits as copies."""
    rng = np.random.default_rng(5)
    gu = rng.standard_normal((7, 2 * 192)).astype(np.float32) * 3
    g, u = gu[:, :192], gu[:, 192:]
    assert row_columns(g)[0] is gu and row_columns(g)[1] == 0
    assert row_columns(u)[0] is gu and row_columns(u)[1] == 192
    for act in ("silu", "gelu_tanh"):
        assert np.array_equal(gated_act(g, u, act), gated_act(g.copy(), u.copy(), act))
        assert np.array_equal(gated_act(u, g, act), gated_act(u.copy(), g.copy(), act))
    # not a column range of a C-contiguous array (every other row; a transposed view): copied, same values
    for view in (gu[::2, :192], np.ascontiguousarray(gu.T)[:192].T):
        y, c = row_columns(view)
        assert c == 0 and y.flags.c_contiguous and np.array_equal(y, view) and not np.shares_memory(y, view)


@pytest.mark.parametrize("act", ["gelu_tanh", "silu"])
def test_gated_act_relative_error_over_the_whole_range(act: str) -> None:
    """The exp-based form against float64, including the far left tail where 1 + tanh(z) cancels:
    a few float32 ulp of relative error wherever the value is not vanishingly small."""
    x = np.concatenate([np.linspace(-40, 40, 20001), np.geomspace(1e-6, 30, 500), -np.geomspace(1e-6, 30, 500)])
    g = x.astype(np.float32).reshape(1, -1)
    x64 = g.astype(np.float64)
    z = np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3) if act == "gelu_tanh" else x64 / 2
    exact = x64 / (1 + np.exp(np.minimum(-2 * z, 700)))
    got = gated_act(g, np.ones_like(g), act).astype(np.float64)
    big = np.abs(exact) > 1e-30
    assert np.all(np.isfinite(got))
    assert np.max(np.abs(got - exact)[big] / np.abs(exact[big])) < 2e-5
    assert np.max(np.abs(got - exact)) < 1e-30 + 2e-5 * np.abs(x64).max()


@pytest.mark.parametrize("style", [ROPE_NEOX, ROPE_NORM])
def test_rope_kernel_equals_numpy_reference(style: str) -> None:
    """Same float32 operations as the numpy form, so the same bits; rows independent of the batch."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((70, 3, 16)).astype(np.float32) * 4
    cos, sin = rope_tables(np.arange(100, 170), 10000.0, 16)
    got = apply_rope(x, cos, sin, style)
    assert np.array_equal(got, apply_rope_ref(x, cos, sin, style))
    assert np.array_equal(apply_rope(x[9:10], cos[9:10], sin[9:10], style)[0], got[9])
    assert not np.array_equal(got, apply_rope_ref(x, cos, sin, ROPE_NORM if style == ROPE_NEOX else ROPE_NEOX))


@pytest.mark.parametrize("window,softcap", [(0, 0.0), (5, 0.0), (0, 20.0)])
def test_paged_attention_matches_reference(window: int, softcap: float) -> None:
    rng = np.random.default_rng(4)
    L, H, KVH, D, start = 23, 4, 2, 8, 15
    pool = BlockPool(1, KVH, D, num_blocks=None, block_tokens=4)
    kv = PageTable(pool)
    kv.reserve(L)
    kv.blocks = kv.blocks[::-1]  # non-contiguous, out-of-order blocks
    k = rng.standard_normal((L, KVH, D)).astype(np.float32)
    v = rng.standard_normal((L, KVH, D)).astype(np.float32)
    kv.write(0, 0, k, v)
    q = rng.standard_normal((L - start, H, D)).astype(np.float32)
    got = paged_attention(q, pool.k[0], pool.v[0], kv.blocks, start, window, 0.3, softcap)
    want = reference_attention(q, k, v, start, window, 0.3, softcap)
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("window", [0, 129, 300])
def test_paged_attention_long_context_chunks(window: int) -> None:
    """Past CHUNK (128) positions a row's keys are split into chunks whose partial softmaxes merge;
    windows that start inside a chunk included. Each row alone gives the batch's bits."""
    rng = np.random.default_rng(8)
    L, H, KVH, D, start = 400, 4, 2, 40, 377
    pool = BlockPool(1, KVH, D, num_blocks=None, block_tokens=16)
    kv = PageTable(pool)
    kv.reserve(L)
    kv.blocks = list(rng.permutation(kv.blocks))  # out-of-order blocks
    k = rng.standard_normal((L, KVH, D)).astype(np.float32) * 2
    v = rng.standard_normal((L, KVH, D)).astype(np.float32)
    kv.write(0, 0, k, v)
    q = rng.standard_normal((L - start, H, D)).astype(np.float32)
    got = paged_attention(q, pool.k[0], pool.v[0], kv.blocks, start, window, 0.3)
    np.testing.assert_allclose(got, reference_attention(q, k, v, start, window, 0.3), atol=1e-5)
    for t in (0, 9, L - start - 1):
        one = paged_attention(q[t:t + 1], pool.k[0], pool.v[0], kv.blocks, start + t, window, 0.3)
        assert np.array_equal(one[0], got[t])


def test_config_from_metadata_rules() -> None:
    from engine.errors import GGUFError
    from engine.gguf.config import from_gguf_metadata

    md = {"general.architecture": "gemma3", "gemma3.embedding_length": 640, "gemma3.block_count": 18,
          "gemma3.feed_forward_length": 2048, "gemma3.attention.head_count": 4, "gemma3.attention.head_count_kv": 1,
          "gemma3.attention.key_length": 256, "gemma3.attention.sliding_window": 512, "gemma3.vocab_size": 100,
          "gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 8.0}
    c = from_gguf_metadata(md)
    assert [c.is_sliding(i) for i in range(12)] == [(i + 1) % 6 != 0 for i in range(12)]
    assert (c.rope_theta(0), c.rope_theta(5)) == (10000.0, 10000.0)  # no freq_base key -> default 1e4 global
    assert (c.rope_pos_scale(0), c.rope_pos_scale(5)) == (1.0, 8.0)  # only global layers are scaled
    assert c.scale == 1 / 16 and c.embed_scale == pytest.approx(640**0.5)
    with pytest.raises(GGUFError, match="unsupported rope scaling 'yarn'"):
        from_gguf_metadata({**md, "gemma3.rope.scaling.type": "yarn"}, where="f.gguf")
    with pytest.raises(GGUFError, match="partial rotary"):
        from_gguf_metadata({**md, "gemma3.rope.dimension_count": 128})
    with pytest.raises(GGUFError, match="f.gguf: unsupported architecture 'gpt2'"):
        from_gguf_metadata({"general.architecture": "gpt2"}, where="f.gguf")
    with pytest.raises(GGUFError, match="missing metadata key 'gemma3.block_count'"):
        from_gguf_metadata({k: v for k, v in md.items() if k != "gemma3.block_count"})


def test_blas_threads_are_settable() -> None:
    # engine.kernels.parallel pins numpy's OpenBLAS to one thread (numba kernels own the cores); it must find it.
    from engine.kernels.parallel import set_blas_threads

    assert set_blas_threads(1)


def test_fak_model_env_selects_synthetic(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine import load_model

    monkeypatch.setenv("FAK_MODEL", "synthetic")
    assert load_model().name == "synthetic"
    monkeypatch.delenv("FAK_MODEL")
    monkeypatch.setenv("FAK_MODEL_DIR", "/no/such.gguf")
    from engine.errors import EngineError

    with pytest.raises(EngineError, match="/no/such.gguf"):
        load_model()
