"""Pipeline stages: aggregate decode throughput with 1 stage vs 2 stages, one core per stage process.

    python bench/pipeline.py [--model gemma3-270m] [--lanes 16] [--new 64] [--prompt 16] [--rounds 2]
                             [--arms 1x1,1x2,2x2,2x4] [--shm | --tcp] [--json PATH]

Arm `SxG`: S `fak worker --role stage` processes (the layers split by weight bytes, the LM head on the last
stage), each pinned to its own core (taskset-style CPU affinity, numba/BLAS at 1 thread), and G groups of
lanes in flight (one scheduler each, engine/pipeline/scheduler.py) in this process, which embeds, samples
and schedules. The same greedy load in every arm (`--lanes` requests, `--prompt`-token prompts, `--new`
tokens, no EOS stop), rounds alternated between arms, tokens checked identical.

Printed per arm: aggregate tok/s, the ratio to arm 1x1, and per stage its layers, utilisation (busy time /
the run's wall time) and bubble (1 - utilisation); plus the bytes per decode step on the first link.
--json PATH also writes the figures there as JSON (bench/report.py draws them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np


def build(model: Any, path: str, stages: int, groups: int, transport: str, cpus: list[int]) -> Any:
    from commands.worker import WORKER_ARGV
    from engine.pipeline.partition import PartitionPlan
    from engine.pipeline.pipeline import remote_pipeline
    from engine.pipeline.scheduler import PipelinedScheduler
    from fak.runtime.local import LocalStages

    plan = PartitionPlan.by_bytes(model, stages)
    workers = LocalStages(path, plan.bands, worker_argv=WORKER_ARGV, cpus=cpus[:stages])
    pm = remote_pipeline(model, [w.address for w in workers.workers], transport=transport)
    pm.pipeline.owned.append(workers)
    s = PipelinedScheduler(pm, groups, block_tokens=16, prefill_chunk=64)
    return s, pm, plan


def one_round(s: Any, prompts: list[list[int]], new: int) -> tuple[float, list[list[int]]]:
    from engine.sched.lane import Request

    t0 = time.perf_counter()
    hs = [s.admit(Request(p, max_new_tokens=new, stop_on_eos=False)) for p in prompts]
    res = [h.result(timeout=1800) for h in hs]
    wall = time.perf_counter() - t0
    assert all(r.error is None for r in res), [r.error for r in res if r.error][:1]
    return wall, [r.token_ids for r in res]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--lanes", type=int, default=16)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--arms", default="1x1,1x2,2x2,2x4")
    ap.add_argument("--tcp", action="store_true", help="stage links over TCP (default: shared memory)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    a = ap.parse_args()

    from engine import load_model
    from engine.gguf.aliases import resolve_model
    from engine.pipeline.metrics import pipeline_stats

    path = str(resolve_model(a.model))
    model = load_model(path, resident=True, progress=False)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    transport = "tcp" if a.tcp else "shm"
    arms = [tuple(int(x) for x in arm.split("x")) for arm in a.arms.split(",")]
    if max(st for st, _ in arms) > len(cpus):
        raise SystemExit(f"{max(st for st, _ in arms)} stages need as many cores, this machine has {len(cpus)}")
    print(f"model {a.model}: {model.config.n_layers} layers, LM head {model.weights.output.nbytes / 2**20:.0f} MiB; "
          f"cores {cpus}, load avg {os.getloadavg()[0]:.1f}; {transport} links")
    built = {}
    for st, g in arms:
        t = time.perf_counter()
        built[(st, g)] = build(model, path, st, g, transport, cpus)
        one_round(built[(st, g)][0], [[2, 100, 200]] * 2, 4)  # warm every process's kernels (not counted)
        print(f"  arm {st}x{g}: stages {built[(st, g)][2].bands}, built and warmed in {time.perf_counter() - t:.1f} s",
              flush=True)
    print(f"\nload: {a.lanes} lanes, {a.prompt}-token prompts, {a.new} new tokens each (greedy), {a.rounds} rounds, "
          "arms alternated")
    walls: dict[tuple[int, int], list[float]] = {k: [] for k in built}
    base: dict[tuple[int, int], dict[str, Any]] = {}
    try:
        for k, (_, pm, _) in built.items():  # figures from here on (warm-up excluded)
            base[k] = {"stats": dict(pm.pipeline.stats), "stages": pm.pipeline.stage_stats()}
        for r in range(a.rounds):
            rng = np.random.default_rng(100 + r)
            prompts = [[2] + [int(t) for t in rng.integers(100, 20000, size=a.prompt - 1)] for _ in range(a.lanes)]
            order = list(built) if r % 2 == 0 else list(built)[::-1]
            tokens = {}
            for k in order:
                wall, tokens[k] = one_round(built[k][0], prompts, a.new)
                walls[k].append(wall)
                print(f"  round {r + 1} arm {k[0]}x{k[1]}: {a.lanes * a.new / wall:7.1f} tok/s ({wall:.1f} s)", flush=True)
            print(f"  round {r + 1}: greedy tokens identical across arms: "
                  f"{all(tokens[k] == tokens[arms[0]] for k in tokens)}")
        print(f"\nload avg at the end {os.getloadavg()[0]:.1f}\n")
        ref = a.lanes * a.new / statistics.mean(walls[arms[0]])
        out_arms: list[dict[str, Any]] = []
        print(f"{'arm':>5} | {'tok/s':>7} | {'vs ' + f'{arms[0][0]}x{arms[0][1]}':>7} | per stage: layers, utilisation, bubble")
        for k, (_, pm, _) in built.items():
            rate = a.lanes * a.new / statistics.mean(walls[k])
            now = pm.pipeline.stage_stats()
            wall = sum(walls[k])
            parts = []
            stage_rows = []
            for b0, b1 in zip(base[k]["stages"], now, strict=False):
                busy = b1["busy_s"] - b0["busy_s"]
                lo, hi = b1["layers"]
                stage_rows.append({"layers": [lo, hi], "head": hi == model.config.n_layers, "utilisation": busy / wall})
                parts.append(f"{lo}:{hi}{' +head' if hi == model.config.n_layers else ''} "
                             f"{100 * busy / wall:.0f}% busy, bubble {100 * (1 - busy / wall):.0f}%")
            ps = pipeline_stats(pm.pipeline)["head"]
            print(f"{k[0]}x{k[1]:<3} | {rate:7.1f} | {rate / ref:6.2f}x | " + " · ".join(parts) +
                  f" | decode step {ps['decode_bytes_per_step']:.0f} B + {ps['decode_header_bytes_per_step']:.0f} B "
                  f"header, in flight max {ps['in_flight_max']}")
            out_arms.append({"arm": f"{k[0]}x{k[1]}", "stages": k[0], "groups": k[1], "tps": rate, "vs_first": rate / ref,
                             "stage": stage_rows, "decode_bytes_per_step": ps["decode_bytes_per_step"]})
        if a.json:
            Path(a.json).write_text(json.dumps({"bench": "pipeline", "model": a.model, "lanes": a.lanes, "new": a.new,
                                                "prompt": a.prompt, "rounds": a.rounds, "transport": transport,
                                                "arms": out_arms}, indent=1))
    finally:
        for s, pm, _ in built.values():
            s.close()
            pm.close()


if __name__ == "__main__":
    main()
