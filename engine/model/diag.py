"""Measurements behind `fak q4kdiag`: memory plan, kernel error + throughput, bandwidth ceiling, top-K.

Everything here is measured on the real file; nothing is assumed. The stream-read ceiling is a
numba parallel reduction over a buffer far larger than the caches, with the same software prefetch
as the decode kernels (what a decode step does with the weights, minus the arithmetic).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from numba import njit, prange

from engine.gguf.reader import GGUFFile, TensorInfo, read_gguf
from engine.kernels.blockdot import prefetch_ahead
from engine.model.forward import Model
from engine.model.resident import QUANT_TYPES, QuantWeight, resident_nbytes, resident_weight, tiled_kind


@dataclass
class TypeUse:
    type: str
    count: int
    resident_bytes: int  # what the resident load keeps (quantized blocks as-is, F16/BF16 -> f32)
    f32_bytes: int  # the plain path's float32 copy


@dataclass
class KernelCheck:
    type: str
    tensor: str
    max_abs_err: float  # kernel vs float64 dequant + matmul, on a row slice
    gbps: float  # 1-row GEMV over the whole tensor: block bytes / median time


@dataclass
class Plan:
    model: str
    arch: str
    file_bytes: int
    types: list[TypeUse]
    bytes_per_token: int  # weight bytes a decode step reads (embedding: one row; LM head: all)

    @property
    def resident_bytes(self) -> int:
        return sum(t.resident_bytes for t in self.types)

    @property
    def f32_bytes(self) -> int:
        return sum(t.f32_bytes for t in self.types)

    @property
    def tensor_types(self) -> dict[str, int]:
        return {t.type: t.count for t in self.types}


def rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _resident_nbytes(t: TensorInfo) -> int:
    kind = tiled_kind(t.qtype, int(t.shape[-1])) if len(t.shape) >= 2 else None
    if kind is not None:  # a 3-D MoE expert stack is one resident matrix per expert (each padded alike)
        rows, cols = int(t.shape[-2]), int(t.shape[-1])
        return t.n_elements // (rows * cols) * resident_nbytes(kind, rows, cols)
    return t.nbytes if t.qtype == QT.F32 else t.n_elements * 4


def plan(g: GGUFFile) -> Plan:
    """Header-only memory plan of a GGUF (no tensor data is read)."""
    counts: Counter[str] = Counter()
    res: Counter[str] = Counter()
    f32: Counter[str] = Counter()
    for t in g.tensors.values():
        counts[t.qtype.name] += 1
        res[t.qtype.name] += _resident_nbytes(t)
        f32[t.qtype.name] += t.n_elements * 4
    types = [TypeUse(k, counts[k], res[k], f32[k]) for k in sorted(counts, key=lambda k: -res[k])]
    per_token = 0
    tied = "output.weight" not in g.tensors
    arch = str(g.metadata.get("general.architecture", "?"))
    n_exp, used = g.metadata.get(f"{arch}.expert_count"), g.metadata.get(f"{arch}.expert_used_count")
    for name, t in g.tensors.items():
        if name == "token_embd.weight":
            per_token += _resident_nbytes(t) if tied else _resident_nbytes(t) // max(1, t.shape[0])
        elif name.endswith("_exps.weight") and isinstance(n_exp, int) and isinstance(used, int) and n_exp > 0:
            per_token += _resident_nbytes(t) // n_exp * min(used, n_exp)  # a token reads its top-k experts only
        else:
            per_token += _resident_nbytes(t)
    name = str(g.metadata.get("general.name", g.path.stem))
    return Plan(name, arch, os.path.getsize(g.path), types, per_token)


def _median_time(fn, reps: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def kernel_checks(g: GGUFFile, reps: int = 5, err_rows: int = 256, seed: int = 0) -> list[KernelCheck]:
    """Per quantized type: max abs error on a row slice of its largest tensor, and GEMV GB/s on it."""
    from gguf.quants import dequantize

    largest: dict[QT, TensorInfo] = {}
    for t in g.tensors.values():
        if (len(t.shape) == 2 and tiled_kind(t.qtype, int(t.shape[1])) is not None
                and (t.qtype not in largest or t.nbytes > largest[t.qtype].nbytes)):
            largest[t.qtype] = t
    rng = np.random.default_rng(seed)
    out: list[KernelCheck] = []
    for qtype, t in sorted(largest.items(), key=lambda kv: -kv[1].nbytes):
        rows, cols = int(t.shape[0]), int(t.shape[1])
        w = resident_weight(t.name, qtype, t.raw, (rows, cols))
        assert isinstance(w, QuantWeight)
        x = rng.standard_normal((1, cols)).astype(np.float32)
        r = min(rows, err_rows)
        part = resident_weight(t.name, qtype, t.raw[:r], (r, cols))
        ref = x.astype(np.float64) @ dequantize(np.asarray(t.raw[:r]), qtype).astype(np.float64).T
        err = float(np.abs(part.matmul(x) - ref).max())
        sec = _median_time(lambda w=w, x=x: w.matmul(x), reps)
        out.append(KernelCheck(w.type_name, t.name, err, w.nbytes / sec / 1e9))
    return out


def synthetic_kernel_checks(skip: set[str], cols: int = 2048, nbytes: int = 64 << 20, reps: int = 5,
                            err_rows: int = 256, seed: int = 0) -> list[KernelCheck]:
    """`kernel_checks` for every resident type not in `skip`, on a synthetic weight of `cols` columns:
    err_rows random rows (N(0, 1) * 0.05, what trained weights look like) quantized by
    engine.quant.quantize.quantize_as, their error measured as on a file's tensors; for the GB/s
    the blocks repeated to ~`nbytes` (far past the caches: the bytes stream from DRAM as a real
    weight's would; their values do not change the kernel's speed)."""
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    from engine.quant.quantize import quantize_as

    rng = np.random.default_rng(seed)
    out: list[KernelCheck] = []
    for qtype, name in QUANT_TYPES.items():
        if name in skip:
            continue
        w = (rng.standard_normal((err_rows, cols)) * 0.05).astype(np.float32)
        raw = quantize_as(qtype, w)
        x = rng.standard_normal((1, cols)).astype(np.float32)
        part = resident_weight(name, qtype, raw, (err_rows, cols))
        assert isinstance(part, QuantWeight)
        ref = x.astype(np.float64) @ dequantize(raw, qtype).astype(np.float64).T
        err = float(np.abs(part.matmul(x) - ref).max())
        bs, ts = GGML_QUANT_SIZES[qtype]
        rows = max(err_rows, nbytes // (cols // bs * ts) // err_rows * err_rows)
        big = resident_weight(name, qtype, np.tile(raw, (rows // err_rows, 1)), (rows, cols))
        assert isinstance(big, QuantWeight)
        sec = _median_time(lambda big=big, x=x: big.matmul(x), reps)
        out.append(KernelCheck(name, f"synthetic {rows}x{cols}", err, big.nbytes / sec / 1e9))
    return out


@njit(parallel=True, cache=True)
def _stream_sum(a, nchunks):  # type: ignore[no-untyped-def]
    """Sum of a uint64 buffer, prefetching ahead as the decode kernels do (without it one core
    pulls ~5.5 GB/s here, with it ~9: the ceiling the kernels are held to must include it)."""
    n = a.shape[0] // 8 * 8
    base = np.uint64(a.ctypes.data)
    part = np.zeros(nchunks, dtype=np.uint64)
    for c in prange(nchunks):
        s = np.uint64(0)
        for i in range(c * n // nchunks // 8 * 8, (c + 1) * n // nchunks // 8 * 8, 8):
            prefetch_ahead(base + np.uint64(i * 8))
            for j in range(8):
                s += a[i + j]
        part[c] = s
    return part.sum()


def stream_read_gbps(nbytes: int = 512 << 20, reps: int = 5) -> float:
    """Measured read bandwidth (GB/s) of all numba threads streaming a buffer of `nbytes`."""
    import numba

    a = np.ones(nbytes // 8, dtype=np.uint64)
    threads = numba.get_num_threads()
    sec = _median_time(lambda: _stream_sum(a, threads * 4), reps)
    return a.nbytes / sec / 1e9


def top_logits(model: Model, ids: list[int], k: int) -> list[tuple[int, float]]:
    """First-token logits of `ids` through `model`'s forward pass: the k largest (id, logit)."""
    from engine.model.session import Session

    s = Session(model)
    logits = s.prefill(ids)
    s.free()
    top = np.argsort(-logits, kind="stable")[:k]
    return [(int(i), float(logits[i])) for i in top]


def open_gguf(path: str | Path) -> GGUFFile:
    return read_gguf(path)


def load_rss_probe(path: str, resident: bool) -> dict[str, int]:
    """Run in a fresh process: RSS added by a model load, after the load and after a first forward.

    The baseline is taken after the engine's imports and the resident kernels' warmup (a process-wide
    boot cost paid once, whatever is loaded); both figures are deltas from it.
    """
    from engine.model.loader import load_model
    from engine.model.resident import warmup
    from engine.model.session import Session
    from engine.model.synthetic import synthetic_model
    from engine.quant.tiles import KIND_GROUPS

    warmup(KIND_GROUPS)  # every tile kind group: whatever the file holds, its kernels are in the baseline
    Session(synthetic_model()).prefill([1, 2, 3])  # loads the forward pass's own kernels
    base = rss_bytes()
    model = load_model(path, resident=resident, progress=False)
    after_load = rss_bytes() - base
    s = Session(model)
    s.prefill([2, 651, 6037, 529, 9405, 563, 496, 1310])
    s.step(506)
    return {"after_load": after_load, "after_forward": rss_bytes() - base, "file_bytes": os.path.getsize(path)}


def measure_load_rss(path: str | Path, resident: bool) -> dict[str, int]:
    """`load_rss_probe` in a subprocess (a clean heap), returned as a dict."""
    import json
    import subprocess
    import sys

    code = ("import json, sys; from engine.model.diag import load_rss_probe; "
            "print(json.dumps(load_rss_probe(sys.argv[1], sys.argv[2] == '1')))")
    r = subprocess.run([sys.executable, "-c", code, str(path), "1" if resident else "0"],
                       capture_output=True, text=True, check=True, timeout=600)
    return json.loads(r.stdout.strip().splitlines()[-1])
