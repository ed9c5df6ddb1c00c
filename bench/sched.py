"""The scheduler against the engine it drives, continuous batching vs one request at a time, and prefix
reuse, on a real model.

    python bench/sched.py [--model gemma3-270m] [--plain] [--levels 1,16,64] [--prompt 8] [--new 128]
                          [--rounds 3] [--profile] [--baseline-sample 4] [--prefix 256] [--blas-prefill]
                          [--skip-engine]

Engine vs scheduler, for each level c (c requests of `--prompt` tokens, `--new` new tokens each):
- engine: `Session.step` (c = 1) / `step_batch` over c sessions, greedy, decode tok/s;
- scheduler: the same c requests admitted together to NativeScheduler(max_running=c) as fak.runtime.boot
  builds it (kernels warmed on its loop thread), decode tok/s = tokens after each lane's first / the
  span from the last first token to the last token (every lane decodes through that span).
Each is measured in a fresh process, in turn each round (medians): numba's OpenMP team belongs to
the thread that launches it, and two launching threads in one process slow each other.
Then for each level c: c distinct requests arrive together.
- batched:  NativeScheduler(max_running=c): aggregate tok/s (generated tokens / wall) and TTFT p50/p99.
- one at a time: the same arrival served with max_running=1 (TTFT includes queueing). Measured on
  the first `--baseline-sample` requests; the rest extrapolated from their mean service time (said so).
Prefix reuse: a `--prefix`-token shared system prompt; TTFT of a second request with the prefix cache
on vs off (same output checked).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
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

    with NativeScheduler(model, warm=True, **kw) as sched:  # warmed on the thread that runs them
        t0 = time.perf_counter()
        hs = [sched.admit(Request(p, max_new_tokens=new, stop_on_eos=False)) for p in reqs]
        res = [h.result() for h in hs]
        wall = time.perf_counter() - t0
    return wall, [r.ttft_s for r in res], res


def engine_rate(model_name: str, resident: bool, c: int, prompt: int, new: int) -> dict[str, Any]:
    """Decode tok/s of c sessions stepped together (`step` for one), in this process."""
    from engine import Session, load_model, step_batch
    from engine.model.session import warmup

    model = load_model(model_name, resident=resident, progress=False)
    warmup()
    rates = []
    for _rep in range(2):  # the first touches the weights
        pool = model.new_pool(None)  # one KV pool for every lane, as the scheduler runs them
        sessions = [Session(model, pool) for _ in range(c)]
        toks = [int(np.argmax(s.prefill(p)))
                for s, p in zip(sessions, prompts(c, prompt, c, model.config.vocab_size), strict=False)]
        t0 = time.perf_counter()
        for _ in range(new - 1):
            if c == 1:
                toks = [int(np.argmax(sessions[0].step(toks[0])))]
            else:
                toks = [int(t) for t in step_batch(sessions, toks).argmax(-1)]
        rates.append(c * (new - 1) / (time.perf_counter() - t0))
        for s in sessions:
            s.free()
    return {"rate": rates[-1]}


def scheduler_rate(model_name: str, resident: bool, c: int, prompt: int, new: int) -> dict[str, Any]:
    """Decode tok/s of c requests admitted together to the scheduler fak.runtime.boot builds, in this process,
    and (FAK_SCHED_PROFILE=1) the loop's time per phase over the last round."""
    from engine.sched.lane import Request
    from fak.runtime.boot import SchedOptions, boot

    b = boot(model_name, resident=resident, sched=SchedOptions.resolve(env=False, max_running=c), show=False)
    prof = b.scheduler.profile
    try:
        rate = 0.0
        for _rep in range(2):
            if prof is not None:
                prof.reset()
            hs = [b.scheduler.admit(Request(p, max_new_tokens=new, stop_on_eos=False))
                  for p in prompts(c, prompt, c, b.model.config.vocab_size)]
            res = [h.result() for h in hs]
            first = max(h._lane.first_token_at for h in hs)  # type: ignore[attr-defined]
            end = max(h._lane.admitted_at + r.latency_s for h, r in zip(hs, res, strict=False))  # type: ignore[attr-defined]
            rate = sum(len(r.token_ids) - 1 for r in res) / (end - first)
    finally:
        b.close()
    table = [[p.phase, p.ms_per_iteration, p.share] for p in prof.table()] if prof is not None else []
    return {"rate": rate, "profile": table}


def _worker(kind: str, a: argparse.Namespace, c: int, profile: bool = False) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", kind, "--model", a.model, "--levels", str(c), "--prompt",
           str(a.prompt), "--new", str(a.new)] + (["--plain"] if a.plain else [])
    env = os.environ | ({"FAK_SCHED_PROFILE": "1"} if profile else {})
    return dict(json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout))


def engine_vs_scheduler(a: argparse.Namespace) -> None:
    print(f"engine vs scheduler: {a.prompt}-token prompts, {a.new} new tokens, greedy, medians of {a.rounds} "
          f"rounds (each figure its own process)")
    print(f"{'c':>3} | {'engine tok/s':>12} | {'scheduler tok/s':>15} | ratio | rounds (scheduler/engine)")
    profiles = {}
    for c in [int(x) for x in a.levels.split(",")]:
        e, s = [], []
        for _ in range(a.rounds):
            e.append(_worker("engine", a, c)["rate"])
            s.append(_worker("scheduler", a, c)["rate"])
        ratios = [y / x for x, y in zip(e, s, strict=False)]
        print(f"{c:>3} | {statistics.median(e):>12.1f} | {statistics.median(s):>15.1f} | "
              f"{statistics.median(ratios):>5.2f} | {' '.join(f'{r:.2f}' for r in ratios)}", flush=True)
        if a.profile:
            profiles[c] = _worker("scheduler", a, c, profile=True)["profile"]
    if profiles:
        print("\nscheduler iteration profile (ms per iteration, share of the loop's wall time; "
              "its own run with FAK_SCHED_PROFILE=1)")
        print(f"{'phase':>8} | " + " | ".join(f"{f'c={c}':>15}" for c in profiles))
        for i, (phase, _, _) in enumerate(next(iter(profiles.values()))):
            print(f"{phase:>8} | " + " | ".join(f"{t[i][1]:>7.3f} ({t[i][2]:>5.1%})" for t in profiles.values()))
    print()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--plain", action="store_true", help="float32 weights instead of resident quantized blocks")
    ap.add_argument("--levels", default="1,16,64")
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-engine", action="store_true", help="skip the engine vs scheduler table")
    ap.add_argument("--profile", action="store_true", help="also profile one scheduler run per level, by phase")
    ap.add_argument("--worker", choices=("engine", "scheduler"), help=argparse.SUPPRESS)
    ap.add_argument("--baseline-sample", type=int, default=4)
    ap.add_argument("--prefix", type=int, default=256)
    ap.add_argument("--blas-prefill", action="store_true",
                    help="prefill each chunk alone with BLAS (batch_prefill=False) instead of in the step's forward")
    a = ap.parse_args()
    if a.worker:
        fn = engine_rate if a.worker == "engine" else scheduler_rate
        print(json.dumps(fn(a.model, not a.plain, int(a.levels), a.prompt, a.new)))
        return
    if not a.skip_engine:
        engine_vs_scheduler(a)
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
        assert all(r1.token_ids == r.token_ids for r1, r in zip(res1, res, strict=False)), "batched output != one-at-a-time"
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

        with NativeScheduler(model, warm=True, **common) as sched:
            sched.admit(Request(system + q1[1:], max_new_tokens=2, stop_on_eos=False)).result()
            r_hit = sched.admit(Request(system + q2, max_new_tokens=4, stop_on_eos=False)).result()
            st = sched.stats()
        with NativeScheduler(model, prefix_cache=False, warm=True, **common) as sched:
            r_cold = sched.admit(Request(system + q2, max_new_tokens=4, stop_on_eos=False)).result()
        assert r_hit.token_ids == r_cold.token_ids, "prefix reuse changed the output"
        print(f"\nprefix reuse: {a.prefix}-token system prompt + {len(q2)}-token suffix")
        print(f"  TTFT cold {r_cold.ttft_s:.2f} s, with reuse {r_hit.ttft_s:.2f} s "
              f"({r_cold.ttft_s / r_hit.ttft_s:.1f}x); hit tokens {r_hit.prefix_hit_tokens}, "
              f"prefix hits {st.prefix_hits}/{st.prefix_queries}")


if __name__ == "__main__":
    main()
