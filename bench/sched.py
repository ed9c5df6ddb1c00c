"""Continuous batching vs one request at a time, and prefix reuse, on a real model.

    python bench/sched.py [--model gemma3-270m] [--plain] [--levels 1,4,16,64] [--prompt 16] [--new 8]
                          [--baseline-sample 4] [--prefix 256] [--blas-prefill]

For each concurrency level c: c distinct requests arrive together.
- batched:  NativeScheduler(max_running=c): aggregate tok/s (generated tokens / wall) and TTFT p50/p99.
- one at a time: the same arrival served with max_running=1 (TTFT includes queueing). Measured on
  the first `--baseline-sample` requests; the rest extrapolated from their mean service time (said so).
Prefix reuse: a `--prefix`-token shared system prompt; TTFT of a second request with the prefix cache
on vs off (same output checked).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def prompts(n: int, length: int, seed: int, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[2] + [int(t) for t in rng.integers(100, min(vocab, 20000), size=length - 1)] for _ in range(n)]


def run(model: Any, reqs: list[list[int]], new: int, **kw: Any) -> tuple[float, list[float], list[Any]]:
    from engine.sched.lane import Request
    from engine.sched.scheduler import NativeScheduler

    with NativeScheduler(model, **kw) as sched:
        t0 = time.perf_counter()
        hs = [sched.admit(Request(p, max_new_tokens=new, stop_on_eos=False)) for p in reqs]
        res = [h.result() for h in hs]
        wall = time.perf_counter() - t0
    return wall, [r.ttft_s for r in res], res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--plain", action="store_true", help="float32 weights instead of resident quantized blocks")
    ap.add_argument("--levels", default="1,4,16,64")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new", type=int, default=8)
    ap.add_argument("--baseline-sample", type=int, default=4)
    ap.add_argument("--prefix", type=int, default=256)
    ap.add_argument("--blas-prefill", action="store_true",
                    help="prefill each chunk alone with BLAS (batch_prefill=False) instead of in the step's forward")
    a = ap.parse_args()
    common = {"batch_prefill": not a.blas_prefill}

    from engine import load_model

    t = time.perf_counter()
    try:
        model = load_model(a.model, resident=not a.plain, progress=False)
        kind = "plain" if a.plain else "resident"
    except Exception as exc:  # resident path not available: fall back to plain, and say so
        print(f"resident load failed ({exc}); using plain float32")
        model, kind = load_model(a.model, progress=False), "plain"
    print(f"model {a.model} ({kind}) loaded in {time.perf_counter() - t:.1f} s; cpus {os.cpu_count()}, "
          f"load avg {os.getloadavg()[0]:.1f}")
    vocab = model.config.vocab_size
    run(model, prompts(2, 8, 99, vocab), 2)  # warm the kernels

    print(f"\nprompt {a.prompt} tokens, {a.new} new tokens per request; "
          f"prefill {'per-lane BLAS' if a.blas_prefill else 'full chunks BLAS, tails batched into the step'}")
    print(f"{'c':>3} | {'batched tok/s':>13} {'TTFT p50':>9} {'p99':>8} | {'1-at-a-time tok/s':>17} "
          f"{'TTFT p50':>9} {'p99':>8} | speedup")
    for c in [int(x) for x in a.levels.split(",")]:
        reqs = prompts(c, a.prompt, c, vocab)
        wall, ttft, res = run(model, reqs, a.new, max_running=c, **common)
        gen = sum(len(r.token_ids) for r in res)
        # one at a time: measure a sample, extrapolate the rest from its mean service time
        k = min(c, a.baseline_sample)
        wall1, ttft1, res1 = run(model, reqs[:k], a.new, max_running=1, **common)
        assert all(r1.token_ids == r.token_ids for r1, r in zip(res1, res)), "batched output != one-at-a-time"
        service = wall1 / k
        first = statistics.mean(t - i * service for i, t in enumerate(ttft1))  # TTFT of a lone request
        seq_ttft = ttft1 + [i * service + first for i in range(k, c)]
        seq_tps = gen / (service * c)
        note = "" if k == c else f"  (one-at-a-time: {k} measured, {c - k} extrapolated)"
        print(f"{c:>3} | {gen / wall:>13.2f} {pct(ttft, 50):>8.2f}s {pct(ttft, 99):>7.2f}s | {seq_tps:>17.2f} "
              f"{pct(seq_ttft, 50):>8.2f}s {pct(seq_ttft, 99):>7.2f}s | {gen / wall / seq_tps:>5.2f}x{note}")

    if a.prefix:
        system = prompts(1, a.prefix, 7, vocab)[0]
        q1, q2 = prompts(2, 8, 8, vocab)
        q2 = q2[1:]
        from engine.sched.lane import Request
        from engine.sched.scheduler import NativeScheduler

        with NativeScheduler(model, **common) as sched:
            sched.admit(Request(system + q1[1:], max_new_tokens=2, stop_on_eos=False)).result()
            r_hit = sched.admit(Request(system + q2, max_new_tokens=4, stop_on_eos=False)).result()
            st = sched.stats()
        with NativeScheduler(model, prefix_cache=False, **common) as sched:
            r_cold = sched.admit(Request(system + q2, max_new_tokens=4, stop_on_eos=False)).result()
        assert r_hit.token_ids == r_cold.token_ids, "prefix reuse changed the output"
        print(f"\nprefix reuse: {a.prefix}-token system prompt + {len(q2)}-token suffix")
        print(f"  TTFT cold {r_cold.ttft_s:.2f} s, with reuse {r_hit.ttft_s:.2f} s "
              f"({r_cold.ttft_s / r_hit.ttft_s:.1f}x); hit tokens {r_hit.prefix_hit_tokens}, "
              f"prefix hits {st.prefix_hits}/{st.prefix_queries}")


if __name__ == "__main__":
    main()
