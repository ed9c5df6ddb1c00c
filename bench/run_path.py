"""Single-request decode speed: the engine directly (Session.step in one thread) vs the path `fak run`
takes (fak.boot: one request on NativeScheduler's loop thread, tokens streamed to the caller).

    python bench/run_path.py [--model gemma3-270m] [--plain] [--rounds 5] [--new 128]

Each round runs both, one after the other, each in a fresh process: numba's OpenMP team belongs to
the thread that launches it, and two threads launching parallel regions in one process slow each
other, so the two paths never share a process. Prints per-round tok/s and the median ratio
fak run path / direct (1.00 = nothing lost).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

PROMPT8 = [2, 651, 6037, 529, 9405, 563, 496, 1310]


def direct(model: str, resident: bool, n: int, reps: int) -> list[float]:
    import numpy as np

    from engine import Session, load_model
    from engine.model.session import warmup

    m = load_model(model, resident=resident, progress=False)
    warmup()
    out = []
    for _ in range(reps + 1):  # the first touches the weights
        s = Session(m)
        logits = s.prefill(PROMPT8)
        t0 = time.perf_counter()
        for _ in range(n - 1):
            logits = s.step(int(np.argmax(logits)))
        out.append((n - 1) / (time.perf_counter() - t0))
        s.free()
    return out[1:]


def through_scheduler(model: str, resident: bool, n: int, reps: int) -> list[float]:
    from engine.sched.lane import Request
    from fak.boot import boot

    b = boot(model, resident=resident, show=False)
    out = []
    try:
        for _ in range(reps + 1):
            h = b.scheduler.admit(Request(PROMPT8, max_new_tokens=n, stop_on_eos=False))
            for _ in h.tokens():  # consumed as `fak run` does: one token at a time, on the caller's thread
                pass
            r = h.result()
            out.append((len(r.token_ids) - 1) / (r.latency_s - r.ttft_s))
    finally:
        b.close()
    return out[1:]


def _worker(kind: str, a: argparse.Namespace) -> float:
    args = [sys.executable, __file__, "--worker", kind, "--model", a.model, "--new", str(a.new)]
    out = subprocess.run(args + (["--plain"] if a.plain else []), capture_output=True, text=True, check=True)
    return statistics.median(json.loads(out.stdout))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--plain", action="store_true", help="float32 weights instead of resident blocks")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--worker", choices=("direct", "sched"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        fn = direct if a.worker == "direct" else through_scheduler
        print(json.dumps(fn(a.model, not a.plain, a.new, 3)))
        return
    d, s = [], []
    for i in range(a.rounds):
        d.append(_worker("direct", a))
        s.append(_worker("sched", a))
        print(f"round {i + 1}: direct {d[-1]:6.1f} tok/s   fak run path {s[-1]:6.1f} tok/s   ratio {s[-1] / d[-1]:.2f}",
              flush=True)
    print(f"median: direct {statistics.median(d):.1f} tok/s, fak run path {statistics.median(s):.1f} tok/s, "
          f"ratio {statistics.median([y / x for x, y in zip(d, s)]):.2f}  "
          f"({a.model}, {'plain' if a.plain else 'resident'}, {a.new} new tokens after 8)")


if __name__ == "__main__":
    main()
