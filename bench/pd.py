"""Prefill/decode disaggregation under a mixed load: short requests decoding while long prompts arrive,
one NativeScheduler (colocated) vs PDCluster (a prefill worker + N decode workers, inproc transport), on the
same model, the same process and so the same cores, the arms alternated round by round.

    python bench/pd.py [--model gemma3-270m | synthetic] [--plain] [--arms colo,pd1,pd1s] [--short 8]
                       [--short-prompt 16] [--new 128] [--long 4] [--long-min 1024] [--long-max 2048]
                       [--long-new 4] [--rounds 2] [--json PATH]

A round: `--short` requests of `--short-prompt` tokens and `--new` new tokens (greedy, no EOS stop) are
admitted together; `--long` prompts of `--long-min`..`--long-max` tokens (`--long-new` new tokens) arrive
spread over the run, the k-th when the first short request has emitted k/(long+1) of its tokens (the same
point of the load in every arm, whatever its speed). Each round uses fresh prompts (no prefix hit from an
earlier round), the same ones for every arm.

Arms: `colo` one NativeScheduler; `pdN` PDCluster(decode_workers=N, transport="inproc"); `pdNs` the same
with numba's thread count set to 1 on the prefill thread and on each decode loop thread (the cores split
between the workers instead of one OpenMP team per launching thread on every core); `procN` what
`fak serve --pd 1:N` runs: `fak worker` processes with the cores split (fak/runtime/local.py split_cores), shm.

Printed per arm: inter-token latency p50/p99/max of the short requests (pooled over their streams and the
rounds), TTFT p50/max of the long prompts (from admit() to the first token, prefill and transfer included),
short-request decode tok/s and round wall time; the ratios against `colo`; and for the P/D arms the bytes
and blocks moved, blocks skipped thanks to residency and import time from `cluster.pd_stats()`.

Read the thread arms for what they are: their workers share one Python process and its cores, so a long
prefill slows the decode steps instead of stalling them between steps. The process arms give each worker
cores of its own, the topology the issue-17 target (P/D ITL p99 <= half the colocated) is about.

--json PATH also writes the figures there as JSON (bench/report.py draws them), the short requests' inter-token
gaps included.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BT, CHUNK, BUDGET = 16, 64, 256


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def prompt(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return [2] + [int(t) for t in rng.integers(100, max(101, min(vocab, 20000)), size=n - 1)]


@dataclass
class Figures:
    itl: list[float] = field(default_factory=list)  # short requests' inter-token gaps (s)
    ttft_long: list[float] = field(default_factory=list)  # long prompts: admit() -> first token (s)
    short_rate: list[float] = field(default_factory=list)  # short-request tokens / round wall (tok/s)
    wall: list[float] = field(default_factory=list)  # until the short requests are done
    wall_all: list[float] = field(default_factory=list)  # until every request is done
    tokens: list[list[list[int]]] = field(default_factory=list)  # per round, every request's tokens


def make_arm(kind: str, model: Any, path: str | None = None, plain: bool = False) -> Any:
    from engine.pd.cluster import PDCluster
    from engine.sched.scheduler import NativeScheduler

    if kind == "colo":
        return NativeScheduler(model, block_tokens=BT, prefill_chunk=CHUNK, prefill_budget=BUDGET, warm=True)
    if kind.startswith("proc"):  # fak serve --pd 1:N's engine: worker processes with the cores split, shm
        from commands.worker import WORKER_ARGV
        from engine.pd.head import PDHead
        from fak.runtime.local import LocalWorkers

        if path is None:
            raise SystemExit("process arms need a GGUF model (not synthetic)")
        lw = LocalWorkers(path, int(kind[4:]), worker_argv=WORKER_ARGV, plain=plain, sched_args=[f"--block-tokens={BT}"],
                          prefill_chunk=CHUNK)
        head = PDHead(lw.prefill.address, [w.address for w in lw.decoders], identity=model.identity,
                      vocab_size=model.config.vocab_size, block_tokens=BT, transport="shm")
        head.owned.append(lw)
        return head
    if not kind.startswith("pd"):
        raise SystemExit(f"unknown arm {kind!r} (colo, pdN, pdNs, procN)")
    split = kind.endswith("s")
    n = int(kind[2:-1] if split else kind[2:])
    c = PDCluster(model, decode_workers=n, transport="inproc", block_tokens=BT, prefill_chunk=CHUNK,
                  prefill_budget=BUDGET)
    if split:
        import numba

        c.prefill.submit(lambda: numba.set_num_threads(1)).result()  # numba's count is per launching thread
        for w in c.decoders.values():
            w.sched.call(lambda: numba.set_num_threads(1)).result()
    return c


def warm(arm: Any, vocab: int) -> None:
    """Compile/launch every kernel path on the threads that will run them (not counted)."""
    from engine.sched.lane import Request

    rng = np.random.default_rng(12345)
    hs = [arm.admit(Request(prompt(rng, n, vocab), max_new_tokens=4, stop_on_eos=False)) for n in (16, 16, 200)]
    for h in hs:
        h.result(timeout=600)


def one_round(arm: Any, shorts: list[list[int]], longs: list[list[int]], new: int, long_new: int,
              fig: Figures) -> None:
    from engine.sched.lane import Request, now

    t0 = time.perf_counter()
    sh = [arm.admit(Request(p, max_new_tokens=new, stop_on_eos=False)) for p in shorts]
    lh: list[tuple[float, Any]] = []
    for k, p in enumerate(longs, 1):
        due = k * new // (len(longs) + 1)
        while len(sh[0]._events) < due and not sh[0].done:
            time.sleep(0.005)
        lh.append((now(), arm.admit(Request(p, max_new_tokens=long_new, stop_on_eos=False))))
    rs = [h.result(timeout=1200) for h in sh]
    wall = time.perf_counter() - t0
    lr = [(t, h, h.result(timeout=1200)) for t, h in lh]
    fig.wall_all.append(time.perf_counter() - t0)
    for r in rs:
        fig.itl.extend(r.itl_s)
    for t, h, r in lr:
        lane = getattr(h, "_lane", None)
        if lane is not None and lane.first_token_at is not None:
            fig.ttft_long.append(lane.first_token_at - t)
        elif getattr(h, "_job", None) is not None and r.ttft_s is not None:  # a cluster's or head's handle
            fig.ttft_long.append(r.ttft_s)
    fig.short_rate.append(sum(len(r.token_ids) for r in rs) / wall)
    fig.wall.append(wall)
    fig.tokens.append([r.token_ids for r in rs] + [r.token_ids for _, _, r in lr])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3-270m", help='an alias/GGUF path, or "synthetic"')
    ap.add_argument("--plain", action="store_true", help="float32 weights instead of resident quantized blocks")
    ap.add_argument("--arms", default="colo,pd1,pd1s,proc1,proc2")
    ap.add_argument("--short", type=int, default=8)
    ap.add_argument("--short-prompt", type=int, default=16)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--long", type=int, default=4)
    ap.add_argument("--long-min", type=int, default=1024)
    ap.add_argument("--long-max", type=int, default=2048)
    ap.add_argument("--long-new", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    a = ap.parse_args()

    from engine import load_model

    t = time.perf_counter()
    if a.model == "synthetic":
        model, kind = load_model("synthetic"), "synthetic"
    else:
        try:
            model = load_model(a.model, resident=not a.plain, progress=False)
            kind = "plain" if a.plain else "resident"
        except Exception as exc:  # noqa: BLE001 - resident path not available: fall back to plain, and say so
            print(f"resident load failed ({exc}); using plain float32")
            model, kind = load_model(a.model, progress=False), "plain"
    vocab = model.config.vocab_size
    path = None
    if a.model != "synthetic":
        from engine.gguf.aliases import resolve_model

        path = str(resolve_model(a.model))
    print(f"model {a.model} ({kind}) loaded in {time.perf_counter() - t:.1f} s; cpus {os.cpu_count()}, "
          f"load avg {os.getloadavg()[0]:.1f}; numba threads {__import__('numba').get_num_threads()}")
    arms = a.arms.split(",")
    if "colo" not in arms:
        arms.insert(0, "colo")
    objs = {}
    for k in arms:
        t = time.perf_counter()
        objs[k] = make_arm(k, model, path, a.plain)
        warm(objs[k], vocab)
        print(f"  arm {k}: built and warmed in {time.perf_counter() - t:.1f} s", flush=True)
    lens = [int(x) for x in np.linspace(a.long_min, a.long_max, a.long)]
    print(f"\nload: {a.short} short requests ({a.short_prompt}-token prompts, {a.new} new tokens) decoding while "
          f"{a.long} long prompts ({', '.join(map(str, lens))} tokens, {a.long_new} new) arrive spread over the "
          f"run; {a.rounds} rounds, arms alternated; block {BT}, prefill chunk {CHUNK}, budget {BUDGET}")
    figs = {k: Figures() for k in arms}
    try:
        for r in range(a.rounds):
            rng = np.random.default_rng(1000 + r)
            shorts = [prompt(rng, a.short_prompt, vocab) for _ in range(a.short)]
            longs = [prompt(rng, n, vocab) for n in lens]
            order = arms if r % 2 == 0 else arms[::-1]
            for k in order:
                one_round(objs[k], shorts, longs, a.new, a.long_new, figs[k])
                f = figs[k]
                print(f"  round {r + 1} {k:>5}: wall {f.wall[-1]:6.1f} s, short {f.short_rate[-1]:6.1f} tok/s",
                      flush=True)
            same = all(figs[k].tokens[r] == figs["colo"].tokens[r] for k in arms)
            print(f"  round {r + 1}: greedy tokens identical across arms: {same}")
        stats = {k: objs[k].pd_stats() if k.startswith("proc") else objs[k].pd_stats() for k in arms if k != "colo"}
    finally:
        for o in objs.values():
            o.close()

    c = figs["colo"]
    print(f"\nload avg at the end {os.getloadavg()[0]:.1f} (other processes on these cores move every arm's figures; "
          f"a 2-thread OpenMP team suffers most when a core is taken away)")
    print(f"\n{'arm':>5} | {'ITL p50':>8} {'p99':>8} {'max':>8} | {'long TTFT p50':>13} {'max':>7} | "
          f"{'short tok/s':>11} | {'shorts':>6} {'all':>6} | ITL p99 ratio | TTFT p50 ratio")
    for k in arms:
        f = figs[k]
        print(f"{k:>5} | {pct(f.itl, 50) * 1e3:>6.1f}ms {pct(f.itl, 99) * 1e3:>6.1f}ms {max(f.itl) * 1e3:>6.0f}ms | "
              f"{pct(f.ttft_long, 50):>12.2f}s {max(f.ttft_long):>6.2f}s | {statistics.mean(f.short_rate):>11.1f} | "
              f"{statistics.mean(f.wall):>5.1f}s {statistics.mean(f.wall_all):>5.1f}s | "
              f"{pct(f.itl, 99) / pct(c.itl, 99):>13.2f} | "
              f"{pct(f.ttft_long, 50) / pct(c.ttft_long, 50):>14.2f}")
    for k, st in stats.items():
        print(f"\n{k}: cluster.pd_stats() (warm-up requests included)")
        pre = st["prefill"]
        print(f"  prefill: {pre['requests']} requests, {pre['prefill_tokens']} tokens prefilled, "
              f"{pre['hit_tokens']} from its prefix cache, {pre['blocks_out']} blocks / {pre['bytes_out'] / 2**20:.1f} "
              f"MiB exported")
        for name, w in st.items():
            if w.get("role") != "decode":
                continue
            rate = w["bytes"] / w["transfer_s"] / 1e9 if w["transfer_s"] else float("nan")
            if "imports" not in w:
                w = {**w, "imports": w.get("imported", 0)}
            print(f"  {name}: {w['requests']} requests, {w['imports']} imports, {w['blocks']} blocks / "
                  f"{w['bytes'] / 2**20:.1f} MiB moved, {w['skipped_blocks']} skipped (resident), import time "
                  f"{w['transfer_s'] * 1e3:.1f} ms ({rate:.2f} GB/s incl. waiting for the loop thread), "
                  f"{w['prefill_tokens']} tokens prefilled on the decode side")
        print(f"  router: {st['router']}")
    best = min((k for k in arms if k != "colo"), key=lambda k: pct(figs[k].itl, 99), default=None)
    if best is not None:
        f = figs[best]
        ratio = pct(f.itl, 99) / pct(c.itl, 99)
        ttft = pct(f.ttft_long, 50) / pct(c.ttft_long, 50)
        done = statistics.mean(f.wall_all) / statistics.mean(c.wall_all)
        print(f"\nissue-17 target (P/D ITL p99 <= 0.5 x colocated): best arm {best} at {ratio:.2f}x -> "
              f"{'met' if ratio <= 0.5 else 'NOT met'} here, with long-prompt TTFT p50 at {ttft:.2f}x and the time "
              f"to finish every request at {done:.2f}x the colocated run.")
    print("Note: the pdN arms are threads of this process sharing its cores; the procN arms are worker processes "
          "with the cores split between them (what fak serve --pd 1:N runs). Either way P/D changes who gets the "
          "cores, not how many there are: lower decode ITL, a longer TTFT for the long prompts.")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "bench": "pd", "model": a.model, "mode": kind, "short": a.short, "short_prompt": a.short_prompt, "new": a.new,
            "long_prompts": lens, "long_new": a.long_new, "rounds": a.rounds,
            "arms": {k: {"itl_p50_s": pct(f.itl, 50), "itl_p99_s": pct(f.itl, 99), "itl_max_s": max(f.itl, default=float("nan")),
                         "long_ttft_p50_s": pct(f.ttft_long, 50), "long_ttft_max_s": max(f.ttft_long, default=float("nan")),
                         "short_tps": statistics.mean(f.short_rate), "wall_s": statistics.mean(f.wall),
                         "wall_all_s": statistics.mean(f.wall_all),
                         "itl_ms": [round(x * 1e3, 2) for x in f.itl]}  # every gap, for a distribution
                     for k, f in figs.items()},
        }, indent=1))

if __name__ == "__main__":
    main()
