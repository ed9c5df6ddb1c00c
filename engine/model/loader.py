"""GGUF path or alias -> Model: name the tensors each block needs (llama.cpp naming), check shapes, load.

`load_model` is the entry point. Plain weights are dequantized to float32 [out, in]; resident ones
(`resident=True`) are handed to engine.model.resident.resident_weight (quantized blocks kept).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.errors import EngineError, GGUFError
from engine.gguf.aliases import default_model, resolve_model
from engine.gguf.config import ModelConfig, from_gguf_metadata
from engine.gguf.identity import gguf_identity
from engine.gguf.reader import GGUFFile, TensorInfo, read_gguf
from engine.model.forward import LayerWeights, Model, Weights
from engine.model.fuse import fuse_siblings
from engine.model.moe import Experts
from engine.model.resident import check_resident, resident_weight
from engine.model.synthetic import synthetic_model
from engine.quant.dequant import SUPPORTED, dequantize


def load_model(path_or_alias: str | Path | None = None, resident: bool = False, progress: bool | None = None) -> Model:
    """A GGUF path or alias (None -> $FAK_MODEL or gemma3-270m; "synthetic" -> the synthetic checkpoint)
    with float32 weights (plain) or its quantized blocks kept resident."""
    if str(path_or_alias if path_or_alias is not None else default_model()) == "synthetic":
        return synthetic_model()  # FAK_MODEL=synthetic selects it too
    g = read_gguf(resolve_model(path_or_alias))
    return build_model(g, make_resident=resident_weight if resident else None, progress=progress)


def _specs(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Expected tensors and numpy shapes. Optional ones (output, biases) are checked when present."""
    s: dict[str, tuple[int, ...]] = {"token_embd.weight": (c.vocab_size, c.hidden), "output_norm.weight": (c.hidden,)}
    for i in range(c.n_layers):
        p = f"blk.{i}."
        if c.pre_norms:
            s.update({p + "attn_norm.weight": (c.hidden,), p + "ffn_norm.weight": (c.hidden,)})
        s.update({
            p + "attn_q.weight": (c.q_dim, c.hidden),
            p + "attn_k.weight": (c.kv_dim, c.hidden),
            p + "attn_v.weight": (c.kv_dim, c.hidden),
            p + "attn_output.weight": (c.hidden, c.q_dim),
        })
        if c.n_experts:  # the router, and each expert's band of the 3-D tensors (split by unfuse)
            s[p + "ffn_gate_inp.weight"] = (c.n_experts, c.hidden)
            for e in range(c.n_experts):
                s.update({_expert(p, "gate", e): (c.expert_ffn, c.hidden), _expert(p, "up", e): (c.expert_ffn, c.hidden),
                          _expert(p, "down", e): (c.hidden, c.expert_ffn)})
        else:
            s.update({p + "ffn_gate.weight": (c.ffn, c.hidden), p + "ffn_up.weight": (c.ffn, c.hidden),
                      p + "ffn_down.weight": (c.hidden, c.ffn)})
        if c.qkv_bias:
            s.update({p + "attn_q.bias": (c.q_dim,), p + "attn_k.bias": (c.kv_dim,), p + "attn_v.bias": (c.kv_dim,)})
        if c.qk_norm:
            q, k = (c.q_dim, c.kv_dim) if c.qk_norm_full else (c.head_dim, c.head_dim)
            s.update({p + "attn_q_norm.weight": (q,), p + "attn_k_norm.weight": (k,)})
        if c.post_norms:
            s.update({p + "post_attention_norm.weight": (c.hidden,), p + "post_ffw_norm.weight": (c.hidden,)})
    return s


def config_for(g: GGUFFile) -> ModelConfig:
    c = from_gguf_metadata(g.metadata, where=str(g.path))
    emb = g.tensors.get("token_embd.weight")
    if emb is None:
        raise GGUFError(f"{g.path}: missing tensor 'token_embd.weight'")
    if len(emb.shape) != 2:
        raise GGUFError(f"{g.path}: tensor 'token_embd.weight' has shape {emb.shape}, expected 2-D")
    if c.vocab_size == 0:
        c = c.with_(vocab_size=emb.shape[0])
    return c.with_(tied_embeddings="output.weight" not in g.tensors)


def _expert(prefix: str, which: str, e: int) -> str:
    """The name unfuse gives expert e's band of `{prefix}ffn_{which}_exps.weight`."""
    return f"{prefix}ffn_{which}_exps.{e}.weight"


def _split_rows(t: TensorInfo, parts: dict[str, int]) -> dict[str, TensorInfo]:
    """A fused matrix (or a 3-D stack of them) cut into consecutive row bands (name -> rows), each a view of the same file bytes:
    a GGUF row is whole blocks, so a band is a plain or resident matrix like any other."""
    out: dict[str, TensorInfo] = {}
    r0 = 0
    for name, rows in parts.items():
        raw = t.raw[r0:r0 + rows]
        out[name] = TensorInfo(name, t.qtype, (rows, t.shape[-1]), t.offset + r0 * raw.shape[1], int(raw.nbytes), raw)
        r0 += rows
    return out


def unfuse(g: GGUFFile, c: ModelConfig) -> dict[str, TensorInfo]:
    """g's tensors with fused projections (phi3: attn_qkv = [q; k; v], ffn_up = [gate; up], twice as tall,
    with no ffn_gate) split into the attn_q/k/v and ffn_gate/up the forward pass reads."""
    ts = dict(g.tensors)
    for i in range(c.n_layers):
        p = f"blk.{i}."
        bands = []
        if p + "attn_qkv.weight" in ts and p + "attn_q.weight" not in ts:
            bands.append(("attn_qkv.weight", {"attn_q.weight": c.q_dim, "attn_k.weight": c.kv_dim,
                                               "attn_v.weight": c.kv_dim}))
        up = ts.get(p + "ffn_up.weight")
        if p + "ffn_gate.weight" not in ts and up is not None and up.shape[0] == 2 * c.ffn:
            bands.append(("ffn_up.weight", {"ffn_gate.weight": c.ffn, "ffn_up.weight": c.ffn}))
        for fused, parts in bands:
            t = ts.pop(p + fused)
            want = (sum(parts.values()), c.hidden)
            if t.shape != want:
                raise GGUFError(f"{g.path}: fused tensor {p + fused!r} has shape {t.shape}, expected {want}")
            ts.update(_split_rows(t, {p + n: r for n, r in parts.items()}))
        if c.n_experts:  # ffn_{gate,up,down}_exps [n_experts, out, in]: one [out, in] matrix per expert
            for which, rows, cols in (("gate", c.expert_ffn, c.hidden), ("up", c.expert_ffn, c.hidden),
                                      ("down", c.hidden, c.expert_ffn)):
                t = ts.pop(p + f"ffn_{which}_exps.weight", None)
                if t is None:
                    raise GGUFError(f"{g.path}: missing tensor {p + f'ffn_{which}_exps.weight'!r} (architecture {c.arch})")
                if t.shape != (c.n_experts, rows, cols):
                    raise GGUFError(f"{g.path}: tensor {t.name!r} has shape {t.shape}, expected "
                                    f"{(c.n_experts, rows, cols)}")
                ts.update(_split_rows(t, {_expert(p, which, e): rows for e in range(c.n_experts)}))
    return ts


def build_model(g: GGUFFile, make_resident: Callable[..., Any] | None = None, progress: bool | None = None) -> Model:
    c = config_for(g)
    # before listing every layer's tensors: a corrupt block_count may be in the billions
    last = f"blk.{c.n_layers - 1}.{'attn_norm' if c.pre_norms else 'attn_output'}.weight"
    if last not in g.tensors:
        raise GGUFError(f"{g.path}: missing tensor {last!r} (block_count is {c.n_layers})")
    for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
        if name in g.tensors:  # phi3 128k (LongRoPE): per-frequency factors switched by context length
            raise GGUFError(f"{g.path}: LongRoPE ({name!r}) is not supported (architecture {c.arch})")
    tensors = unfuse(g, c)
    specs = _specs(c)
    if not c.tied_embeddings:
        specs["output.weight"] = (c.vocab_size, c.hidden)
    if "rope_freqs.weight" in tensors:
        specs["rope_freqs.weight"] = (c.head_dim // 2,)
    for name, shape in specs.items():
        t = tensors.get(name)
        if t is None:
            raise GGUFError(f"{g.path}: missing tensor {name!r} (architecture {c.arch})")
        if t.shape != shape:
            raise GGUFError(f"{g.path}: tensor {name!r} has shape {t.shape}, expected {shape}")
        if t.qtype not in SUPPORTED:
            raise GGUFError(f"{g.path}: tensor {name!r} has unsupported type {t.qtype.name}")
        if make_resident is not None and len(t.shape) == 2:  # before any tensor is read
            try:
                check_resident(name, t.qtype)
            except EngineError as exc:
                raise GGUFError(f"{g.path}: {exc}") from None
    cache: dict[str, Any] = {}
    total = sum(tensors[n].nbytes for n in specs)
    with _Progress(progress, total, g.path.name) as bar:
        for name in specs:
            t = tensors[name]
            cache[name] = _materialize(t, make_resident)
            bar.advance(t.nbytes)

    def get(name: str) -> Any:
        return cache.get(name)

    layers = [
        LayerWeights(
            attn_norm=get(f"blk.{i}.attn_norm.weight"), wq=get(f"blk.{i}.attn_q.weight"),
            wk=get(f"blk.{i}.attn_k.weight"), wv=get(f"blk.{i}.attn_v.weight"),
            wo=get(f"blk.{i}.attn_output.weight"), ffn_norm=get(f"blk.{i}.ffn_norm.weight"),
            w_gate=get(f"blk.{i}.ffn_gate.weight"), w_up=get(f"blk.{i}.ffn_up.weight"),
            w_down=get(f"blk.{i}.ffn_down.weight"), bq=get(f"blk.{i}.attn_q.bias"), bk=get(f"blk.{i}.attn_k.bias"),
            bv=get(f"blk.{i}.attn_v.bias"), q_norm=get(f"blk.{i}.attn_q_norm.weight"),
            k_norm=get(f"blk.{i}.attn_k_norm.weight"), post_attn_norm=get(f"blk.{i}.post_attention_norm.weight"),
            post_ffn_norm=get(f"blk.{i}.post_ffw_norm.weight"), moe=_experts(c, get, f"blk.{i}."),
        )
        for i in range(c.n_layers)
    ]
    if make_resident is not None and os.environ.get("FAK_FUSE", "1") != "0":  # FAK_FUSE=0: apart, for A/B runs
        for lw in layers:
            fuse_siblings((lw.wq, lw.wk, lw.wv))
            fuse_siblings((lw.w_gate, lw.w_up))
            for gate, up in zip(lw.moe.gate, lw.moe.up, strict=False) if lw.moe is not None else ():
                fuse_siblings((gate, up))  # each expert's gate and up: one launch when the router picks it
    emb = cache["token_embd.weight"]
    w = Weights(token_embd=emb, layers=layers, output_norm=cache["output_norm.weight"],
                output=emb if c.tied_embeddings else cache["output.weight"], rope_freqs=cache.get("rope_freqs.weight"))
    types: dict[str, int] = {}  # the file's tensors (a fused one once, not its bands)
    for name in [n for n in specs if n in g.tensors] + sorted(set(g.tensors) - set(tensors)):
        types[g.tensors[name].qtype.name] = types.get(g.tensors[name].qtype.name, 0) + 1
    return Model(c, w, name=g.path.name, tensor_types=types, identity=gguf_identity(g))


def _experts(c: ModelConfig, get: Callable[[str], Any], p: str) -> Experts | None:
    if not c.n_experts:
        return None
    e = range(c.n_experts)
    return Experts(router=get(p + "ffn_gate_inp.weight"), gate=[get(_expert(p, "gate", i)) for i in e],
                   up=[get(_expert(p, "up", i)) for i in e], down=[get(_expert(p, "down", i)) for i in e])


def _materialize(t: TensorInfo, make_resident: Callable[..., Any] | None) -> Any:
    if make_resident is not None and len(t.shape) == 2:
        return make_resident(t.name, t.qtype, t.raw, (int(t.shape[0]), int(t.shape[1])))
    flat = dequantize(t.raw, t.qtype, t.n_elements)
    return flat.reshape(t.shape)


class _Progress:
    """A rich progress bar on stderr when it is a terminal (or when asked), silent otherwise."""

    def __init__(self, enabled: bool | None, total: int, label: str) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.total, self.label = total, label
        self._bar: Any = None

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TimeElapsedColumn

            self._bar = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                                 TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(f"loading {self.label}", total=self.total)
        self.t0 = time.perf_counter()
        return self

    def advance(self, n: int) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, n)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

