"""Constrained decoding cost: the per-token mask, and decode with vs without a grammar in the scheduler.

    python bench/grammar.py [--model gemma3-270m] [--vocab PATH.gguf,...] [--levels 1,16] [--new 128]
                            [--rounds 3] [--reps 5] [--profile] [--skip-mask] [--skip-decode]

1. Mask cost per token (engine/grammar: llguidance fills the bitmask, engine/kernels/bitmask.py applies
   it in place to a float32 row, then the token is consumed), replaying schema instances encoded by the
   model's tokenizer (bench/grammar_libs.py's three schemas): median and p99 µs, per part and in all,
   and per token position the fastest of the replays (what it costs there when no other process
   preempts it: the box is shared).
2. Decode tok/s of c requests admitted together to the scheduler fak.runtime.boot builds (resident weights,
   kernels warmed on its loop thread), greedy, `--new` tokens each, stop_on_eos off: free vs every lane
   under a grammar (any JSON object: this base model keeps adding keys, so lanes stay constrained for
   the whole run; lanes that end early are counted and said). Rate = tokens after each lane's first /
   the span from the last first token to the last token. One process per level with one scheduler
   (its loop thread is the only one running kernels), free and grammar runs in pairs, alternating
   which goes first, so the shared box's load changes hit both; medians of the per-pair ratios.
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

ASK = ("Describe a fictional person as JSON.", "Give me a JSON record of a famous book.",
       "Write a JSON object describing a cat.", "Return the weather in Paris as JSON.")


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def mask_cost(vocab: str, reps: int) -> dict[str, Any]:
    """Per-token µs of Matcher.mask (fill + apply) and Matcher.advance on `vocab`'s tokenizer."""
    from grammar_libs import SCHEMAS

    from engine.grammar import GrammarSpec, compiler_for
    from engine.kernels.bitmask import warmup
    from engine.tokenizer import load_tokenizer

    tok = load_tokenizer(vocab)
    warmup()
    comp = compiler_for(tok, tok.vocab_size, tuple(sorted(tok.eos_ids)))
    t0 = time.perf_counter()
    comp.warm()
    setup = time.perf_counter() - t0
    raw = np.random.default_rng(0).standard_normal(tok.vocab_size).astype(np.float32)
    mask_us: list[float] = []
    adv_us: list[float] = []
    start_ms: list[float] = []
    fastest: list[float] = []  # per token position, the fastest replay (mask + advance): load spikes drop out
    for schema, instance in SCHEMAS.values():
        spec = GrammarSpec.json_schema(schema, (", ", ": "))
        ids = list(tok.encode(json.dumps(instance), add_special=False))
        base = len(mask_us)
        for _ in range(reps):
            t0 = time.perf_counter()
            m = comp.matcher(spec)
            start_ms.append((time.perf_counter() - t0) * 1e3)
            for t in ids:
                row = raw.copy()  # a fresh row, as a forward returns one
                a = time.perf_counter()
                m.mask(row)
                b = time.perf_counter()
                assert np.isfinite(row[t]), f"token {t} masked"
                m.advance(t)
                c = time.perf_counter()
                mask_us.append((b - a) * 1e6)
                adv_us.append((c - b) * 1e6)
        runs = [[mask_us[base + r * len(ids) + i] + adv_us[base + r * len(ids) + i] for i in range(len(ids))]
                for r in range(reps)]
        fastest += [min(col) for col in zip(*runs, strict=False)]
    total = [a + b for a, b in zip(mask_us, adv_us, strict=False)]
    return {"vocab": vocab, "n_vocab": tok.vocab_size, "setup_s": setup, "tokens": len(total),
            "start_ms": statistics.median(start_ms),
            "mask": (statistics.median(mask_us), pct(mask_us, 99)),
            "advance": (statistics.median(adv_us), pct(adv_us, 99)),
            "total": (statistics.median(total), pct(total, 99), statistics.fmean(total)),
            "fastest": (statistics.median(fastest), pct(fastest, 99), statistics.fmean(fastest))}


def decode_rates(model_name: str, c: int, new: int, rounds: int) -> dict[str, Any]:
    """Decode tok/s of c requests admitted together, all free or all under a grammar, in this process:
    one scheduler (its loop thread runs every kernel), a warm-up run of each, then `rounds` pairs in
    alternating order (free first, then grammar first, ...), so a change in the box's load hits both."""
    from engine.grammar import GrammarSpec
    from engine.sched.lane import Request
    from fak.runtime.boot import SchedOptions, boot

    b = boot(model_name, resident=True, sched=SchedOptions.resolve(env=False, max_running=c), show=False)
    sched, tok = b.scheduler, b.tokenizer
    prof = sched.profile
    sched.warm_grammar()
    ids = [tok.encode_chat([{"role": "user", "content": ASK[i % len(ASK)] + " " * (i // len(ASK))}]) for i in range(c)]
    out: dict[str, Any] = {"free": [], "grammar": [], "lengths": [], "reasons": [], "profile": {}}

    def once(grammar: bool) -> float:
        spec = GrammarSpec.json_object() if grammar else None
        if prof is not None:
            prof.reset()
        hs = [sched.admit(Request(p, max_new_tokens=new, stop_on_eos=False, grammar=spec)) for p in ids]
        res = [h.result() for h in hs]
        first = max(h._lane.first_token_at for h in hs)  # type: ignore[attr-defined]
        end = max(h._lane.admitted_at + r.latency_s for h, r in zip(hs, res, strict=False))  # type: ignore[attr-defined]
        if grammar:
            out["lengths"] += [len(r.token_ids) for r in res]
            out["reasons"] += [r.finish_reason.value for r in res]
        if prof is not None:
            out["profile"]["grammar" if grammar else "free"] = [[p.phase, p.ms_per_iteration, p.share]
                                                               for p in prof.table()]
        return sum(len(r.token_ids) - 1 for r in res) / (end - first)

    try:
        once(False), once(True)  # warm-up: the first touches the weights, the first grammar compiles
        out["lengths"], out["reasons"] = [], []
        for r in range(rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for g in order:
                out["grammar" if g else "free"].append(once(g))
    finally:
        b.close()
    return out


def _worker(a: argparse.Namespace, c: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", "--model", a.model, "--levels", str(c), "--new", str(a.new),
           "--rounds", str(a.rounds)]
    env = os.environ | ({"FAK_SCHED_PROFILE": "1"} if a.profile else {})
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"worker failed: {p.stderr.strip()[-2000:]}")
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--vocab", default="", help="more tokenizers for the mask cost (GGUF paths or aliases)")
    ap.add_argument("--levels", default="1,16")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5, help="replays of each schema instance for the mask cost")
    ap.add_argument("--profile", action="store_true", help="FAK_SCHED_PROFILE=1 in the runs: ms per iteration by phase")
    ap.add_argument("--skip-mask", action="store_true")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(decode_rates(a.model, int(a.levels), a.new, a.rounds)))
        return
    print(f"cpus {os.cpu_count()}, load avg {' '.join(f'{x:.1f}' for x in os.getloadavg())} (1/5/15 min)")
    if not a.skip_mask:
        print("\nmask cost per token (llguidance fill + in-place apply; advance = consume the token), µs")
        print(f"{'vocabulary':>40} | {'tokens':>6} | {'setup s':>7} | {'start ms':>8} | {'mask p50/p99':>13} | "
              f"{'advance p50/p99':>15} | {'total p50/p99/mean':>19} | {'fastest replay p50/p99/mean':>27}")
        for v in [a.model] + [x for x in a.vocab.split(",") if x]:
            r = mask_cost(v, a.reps)
            name = v if len(v) <= 40 else "..." + v[-37:]
            print(f"{name:>40} | {r['tokens']:>6} | {r['setup_s']:>7.2f} | {r['start_ms']:>8.2f} | "
                  f"{r['mask'][0]:>6.1f}/{r['mask'][1]:<6.1f} | {r['advance'][0]:>7.1f}/{r['advance'][1]:<7.1f} | "
                  f"{r['total'][0]:>6.1f}/{r['total'][1]:>6.1f}/{r['total'][2]:>5.1f} | "
                  f"{'/'.join(f'{x:.1f}' for x in r['fastest']):>27}", flush=True)
    if a.skip_decode:
        return
    print(f"\ndecode, {a.model} resident, {a.new} new tokens per lane, greedy; free vs json_object grammar on every "
          f"lane; one process per level, {a.rounds} free/grammar pairs in alternating order; medians")
    print(f"{'c':>3} | {'free tok/s':>10} | {'grammar tok/s':>13} | ratio | pairs (grammar/free) | grammar lanes")
    profiles = {}
    for c in [int(x) for x in a.levels.split(",")]:
        r = _worker(a, c)
        ratios = [g / f for f, g in zip(r["free"], r["grammar"], strict=False)]
        early = [n for n in r["lengths"] if n < a.new]
        notes = (f"{len(early)} of {len(r['lengths'])} ended early ({sorted(set(r['reasons']))})" if early
                 else "all constrained to the end")
        print(f"{c:>3} | {statistics.median(r['free']):>10.1f} | {statistics.median(r['grammar']):>13.1f} | "
              f"{statistics.median(ratios):>5.2f} | {' '.join(f'{x:.2f}' for x in ratios):>20} | {notes}", flush=True)
        profiles[c] = r["profile"]
    if a.profile:
        print("\niteration profile of the last run of each kind (ms per iteration, share of the loop's wall time)")
        cols = [(c, kind) for c in profiles for kind in ("free", "grammar")]
        print(f"{'phase':>8} | " + " | ".join(f"{f'c={c} {kind}':>16}" for c, kind in cols))
        for i, (phase, _, _) in enumerate(profiles[cols[0][0]]["free"]):
            print(f"{phase:>8} | " + " | ".join(f"{profiles[c][k][i][1]:>8.3f} ({profiles[c][k][i][2]:>5.1%})"
                                                 for c, k in cols))
    print(f"\nload avg at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
