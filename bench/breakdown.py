"""Where a single-lane decode step goes: time per kernel call site, bytes each weight product reads, GB/s.
With --prefill N[,M..]: where a long prompt's prefill goes, through the scheduler as `fak serve` runs it.

    python bench/breakdown.py [--model ALIAS|PATH] [--steps 128] [--runs 3]
    python bench/breakdown.py --model qwen2.5-coder-0.5b --prefill 8192,16384

Wraps the forward pass's calls (every weight product by weight name, attention, the fused norms, the
activation, RoPE tables, the embedding row) with a perf_counter_ns pair, runs `--runs` x `--steps`
greedy decode steps and prints ms per step for each, the weight bytes each product read and its GB/s
against the stream-read ceiling measured in the same run. "python between kernels" is the step time
left over (the forward's own Python). The instrumented step is printed beside the plain one: the
wrappers cost ~1 us a call. bench/decode.py --breakdown prints this table after its own.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

PROMPT8 = [2, 651, 6037, 529, 9405, 563, 496, 1310]
GLUE = ("rmsnorm", "residual_norm", "qkv_prep", "gated_act", "rope_tables", "attention_groups")


@dataclass
class Site:
    name: str
    ms: float  # per decode step
    calls: float  # per decode step
    bytes: int  # weight bytes per step (products only)


_ON = [False]  # the wrappers count only while decode steps run (not the prompt's prefill)


def step_seconds(model: Any, n: int) -> float:
    """Seconds per greedy decode step, over n steps after the 8-token prompt (its prefill not timed)."""
    from engine import Session

    s = Session(model)
    logits = s.prefill(PROMPT8)
    _ON[0] = True
    t0 = time.perf_counter()
    for _ in range(n):
        logits = s.step(int(np.argmax(logits)))
    dt = time.perf_counter() - t0
    _ON[0] = False
    return dt / n


@contextmanager
def _instrumented(times: Counter[str], calls: Counter[str], nbytes: Counter[str]) -> Iterator[None]:
    import engine.model.attention_groups as AG
    import engine.model.forward as F
    from engine.model.resident import QuantWeight

    pc = time.perf_counter_ns
    labels: dict[int, str] = {}

    def label(w: Any) -> str:
        name = labels.get(id(w))
        if name is None:
            name = labels[id(w)] = re.sub(r"blk\.\d+\.|\.weight", "", getattr(w, "name", "f32"))
        return name

    def timed(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **k: Any) -> Any:
            if not _ON[0]:
                return fn(*a, **k)
            t = pc()
            r = fn(*a, **k)
            times[key] += pc() - t
            calls[key] += 1
            return r
        return call

    product = QuantWeight.matmul

    def matmul(self: QuantWeight, x: np.ndarray, out: Any = None) -> np.ndarray:
        if not _ON[0]:
            return product(self, x, out)
        t = pc()
        r = product(self, x, out)
        key = "product " + label(self)
        times[key] += pc() - t
        calls[key] += 1
        nbytes[key] += self.nbytes
        return r

    from engine.kernels.lane_kernel import (
        HEAD_PHASES,
        L_DOWN,
        L_GU0,
        L_GU1,
        L_O,
        L_QKV0,
        L_QKV1,
        P_NTILES,
        P_WSTRIDE,
        PHASES_PER_LAYER,
    )
    from engine.model.lane_step import LanePlan

    lane_run = LanePlan.run
    ns_per_cycle = _ns_per_cycle()

    def lane(self: LanePlan, model: Any, x: np.ndarray, ln: Any, lo: int, hi: int, kv0: int, stamps: Any = None,
             head: bool = False) -> Any:
        if not _ON[0]:
            return lane_run(self, model, x, ln, lo, hi, kv0, head=head)
        with_head = head and self.head >= 0
        st = np.zeros(2 + PHASES_PER_LAYER * (hi - lo) + HEAD_PHASES * with_head, np.int64)
        t = pc()
        r = lane_run(self, model, x, ln, lo, hi, kv0, st, head=head)
        dt = pc() - t
        ns = np.diff(st) * ns_per_cycle
        tile_bytes = self.prods[:, P_NTILES] * self.prods[:, P_WSTRIDE]

        def add(key: str, i: int, nb: int = 0) -> None:
            times["lane kernel: " + key] += ns[i]
            calls["lane kernel: " + key] += 1
            nbytes["lane kernel: " + key] += nb

        add(LANE_PHASES[0], 0)
        for li in range(lo, hi):
            lp = self.layer_prods[li]
            ranges = {0: (lp[L_QKV0], lp[L_QKV1]), 4: (lp[L_O], lp[L_O] + 1), 6: (lp[L_GU0], lp[L_GU1]),
                      8: (lp[L_DOWN], lp[L_DOWN] + 1)}  # a layer's phase k (LANE_PHASES[1 + k]) -> its products
            for k in range(PHASES_PER_LAYER):
                a, b = ranges.get(k, (0, 0))
                add(LANE_PHASES[1 + k], 1 + (li - lo) * PHASES_PER_LAYER + k, int(tile_bytes[a:b].sum()))
        if with_head:
            i = 1 + (hi - lo) * PHASES_PER_LAYER
            add("output norm (one task)", i)
            add("product output (LM head)", i + 1, int(tile_bytes[self.head]))
        times["lane kernel: call, team start and exit"] += dt - ns.sum()
        calls["lane kernel: call, team start and exit"] += 1
        return r

    saved = [(F, n, getattr(F, n)) for n in GLUE] + [(AG.PoolRows, "attend", AG.PoolRows.attend),
                                                      (QuantWeight, "matmul", product), (F.linear, "take", F.linear.take),
                                                      (LanePlan, "run", lane_run)]
    try:
        QuantWeight.matmul = matmul  # type: ignore[method-assign]
        LanePlan.run = lane  # type: ignore[method-assign]
        for n in GLUE:
            setattr(F, n, timed(n, getattr(F, n)))
        AG.PoolRows.attend = timed("attention (K/V store, scores, softmax, P.V)", AG.PoolRows.attend)  # type: ignore[method-assign]
        F.linear.take = timed("embedding row", F.linear.take)
        yield
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)


# the lane kernel's phases (engine/kernels/lane_kernel.py), timed by its first thread's cycle counter
LANE_PHASES = ("first input norm", "products attn_q+k+v", "qkv_prep + K/V store (one task)",
               "attention chunks (scores, softmax, P.V)", "attention merge", "product attn_output",
               "residual_norm after attention (one task)", "products ffn_gate+up", "gated_act + quantize (two halves)",
               "product ffn_down", "residual_norm + next input norm (one task)")


def _ns_per_cycle() -> float:
    """The cycle counter's period, against perf_counter over 50 ms."""
    from numba import njit

    from engine.kernels.tasks import cycles

    now = njit(lambda: cycles())
    now()
    c0, t0 = now(), time.perf_counter_ns()
    time.sleep(0.05)
    c1, t1 = now(), time.perf_counter_ns()
    return (t1 - t0) / (c1 - c0)


def breakdown(model: Any, steps: int = 128, runs: int = 3) -> tuple[float, float, list[Site]]:
    """(plain step s, instrumented step s, sites sorted by time) over runs x steps decode steps."""
    step_seconds(model, 8)
    plain = float(np.median([step_seconds(model, steps) for _ in range(runs)]))
    times: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    nbytes: Counter[str] = Counter()
    with _instrumented(times, calls, nbytes):
        step_seconds(model, 4)
        times.clear(), calls.clear(), nbytes.clear()
        inst = float(np.median([step_seconds(model, steps) for _ in range(runs)]))
    n = steps * runs
    sites = [Site(k, v / n / 1e6, calls[k] / n, nbytes[k] // n) for k, v in times.items()]
    return plain, inst, sorted(sites, key=lambda s: -s.ms)


def print_breakdown(model: Any, steps: int, runs: int, ceiling_gbps: float) -> None:
    plain, inst, sites = breakdown(model, steps, runs)
    print(f"\nwhere a decode step goes ({runs} x {steps} steps; plain step {plain * 1e3:.2f} ms, "
          f"instrumented {inst * 1e3:.2f} ms; ceiling {ceiling_gbps:.1f} GB/s):")
    print(f"  {'call site':46s} {'ms/step':>8s} {'calls':>6s} {'MiB':>7s} {'GB/s':>6s} {'at ceiling':>10s}")
    for s in sites:
        extra = ""
        if s.bytes:
            extra = f" {s.bytes / 2**20:7.1f} {s.bytes / (s.ms / 1e3) / 1e9:6.1f} {s.bytes / ceiling_gbps / 1e6:8.2f} ms"
        print(f"  {s.name:46s} {s.ms:8.2f} {s.calls:6.1f}{extra}")
    rest = inst * 1e3 - sum(s.ms for s in sites)
    print(f"  {'python between kernels':46s} {rest:8.2f}")


def prefill_breakdown(model: Any, n_tokens: int, gflops: float) -> None:
    """One prompt of n_tokens through a NativeScheduler (thread=False, the serve path), instrumented: time in
    the weight products, in prefill attention, in the glue, and the rest (Python, the scheduler); beside each,
    the FLOPs it does and the time it would take at `gflops` (this machine's float32 FMA rate, measured)."""
    from engine.model.attention_groups import PrefillLane
    from engine.sched.lane import Request
    from engine.sched.scheduler import NativeScheduler

    c = model.config
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(100, min(c.vocab_size, 20000), n_tokens)]
    times: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    nbytes: Counter[str] = Counter()
    sched = NativeScheduler(model, thread=False, prefix_cache=False)
    attend = PrefillLane.attend
    pc = time.perf_counter_ns

    def timed_attend(self: Any, *a: Any) -> Any:
        t = pc()
        r = attend(self, *a)
        times["attention (prefill chunks)"] += pc() - t
        calls["attention (prefill chunks)"] += 1
        return r

    with _instrumented(times, calls, nbytes):
        PrefillLane.attend = timed_attend  # type: ignore[method-assign]
        try:
            _ON[0] = True
            t0 = time.perf_counter()
            h = sched.admit(Request(prompt, max_new_tokens=1))
            while sched.step():
                pass
            wall = time.perf_counter() - t0
            _ON[0] = False
        finally:
            PrefillLane.attend = attend  # type: ignore[method-assign]
    h.result(0)
    sched.close()
    # FLOPs: every weight product is 2 x params per row; attention 4 x head_dim x heads per (query, key) pair
    params = sum(w.shape[0] * w.shape[1] for w in _products(model))
    pairs = sum(_pairs(n_tokens, c.window(li)) for li in range(c.n_layers))
    flops = {"products": 2.0 * params * n_tokens, "attention (prefill chunks)": 4.0 * c.head_dim * c.n_heads * pairs}
    prod_s = sum(v for k, v in times.items() if k.startswith("product")) / 1e9
    print(f"\nprefill of {n_tokens} tokens: {wall:.1f} s, {n_tokens / wall:.0f} tok/s "
          f"(FMA ceiling {gflops:.0f} GFLOP/s)")
    print(f"  {'call site':34s} {'s':>7s} {'share':>6s} {'GFLOP':>8s} {'GFLOP/s':>8s} {'at ceiling':>10s}")
    rows = [("products", prod_s)] + [(k, v / 1e9) for k, v in times.items() if not k.startswith("product")]
    for name, sec in sorted(rows, key=lambda r: -r[1]):
        f = flops.get(name, 0.0)
        extra = f" {f / 1e9:8.0f} {f / 1e9 / max(sec, 1e-9):8.1f} {f / 1e9 / gflops:9.1f} s" if f else ""
        print(f"  {name:34s} {sec:7.2f} {sec / wall:6.1%}{extra}")
    rest = wall - sum(sec for _, sec in rows)
    print(f"  {'python, scheduler, rest':34s} {rest:7.2f} {rest / wall:6.1%}")


def _products(model: Any) -> list[Any]:
    """Every weight a token's forward multiplies by (per layer, and the LM head once per chunk, ignored)."""
    out = []
    for lw in model.weights.layers:
        out += [w for w in (lw.wq, lw.wk, lw.wv, lw.wo, lw.w_gate, lw.w_up, lw.w_down) if w is not None]
    return out


def _pairs(n: int, window: int) -> int:
    """(query, key) pairs causal attention over n positions scores (within a sliding window if any)."""
    if window <= 0 or window >= n:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def fma_gflops(n: int = 1024, reps: int = 5) -> float:
    """float32 GEMM rate of this machine's BLAS, all threads: the ceiling for prefill's FLOPs."""
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    a @ a
    best = min(_timed(lambda: a @ a) for _ in range(reps))
    return 2 * n**3 / best / 1e9


def _timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    from engine import load_model
    from engine.errors import EngineError
    from engine.gguf.aliases import resolve_model
    from engine.model.diag import stream_read_gbps

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prefill", default=None, help="prompt lengths (comma-separated): a prefill breakdown each")
    a = ap.parse_args()
    try:
        model = load_model(str(resolve_model(a.model)), resident=True, progress=False)
    except (EngineError, OSError) as e:  # a bad path or file: one line, exit 2
        print(f"bench/breakdown.py: --model {a.model}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if a.prefill:
        from engine.model.session import warmup

        warmup()
        gflops = fma_gflops()
        for n in [int(x) for x in a.prefill.split(",")]:
            prefill_breakdown(model, n, gflops)
        return
    print_breakdown(model, a.steps, a.runs, stream_read_gbps(256 << 20, 5))


if __name__ == "__main__":
    main()
