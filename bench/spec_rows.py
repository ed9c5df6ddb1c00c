"""What a verification step costs by its rows: the staircase speculation's draft lengths are chosen on.

    python bench/spec_rows.py [--model qwen2.5-coder-0.5b] [--context 500] [--lanes 1,16] [--extra 0..24]

For each lane count L and each number of extra rows D (draft tokens spread over the lanes, as the
scheduler's verification feeds them): the median time of one `forward_batch` of L + D rows, every row
asking for logits, each lane holding `--context` tokens of KV. Printed beside it: what the scheduler's
cost model predicts (`engine.sched.step_cost.measure`: the staircase of lane groups timed on one short
session, plus each row's attention to its context and each lane's own share), and its error.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from engine.model.session import Session, forward_batch, warmup
from engine.sched.step_cost import measure, rows_reach
from fak.runtime.boot import SchedOptions, boot


def timed(sessions: list[Session], rows: list[int], reps: int) -> float:
    base = [s.length for s in sessions]
    times = []
    for _ in range(reps):
        chunks = [[11 + i] * r for i, r in enumerate(rows)]
        t = time.perf_counter()
        forward_batch(sessions, chunks, rows)
        times.append(time.perf_counter() - t)
        for s, n in zip(sessions, base, strict=True):
            s.truncate(n)
    return float(np.median(times)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--context", type=int, default=500)
    ap.add_argument("--lanes", default="1,16")
    ap.add_argument("--extra", default="0,1,2,3,4,5,6,7,8,9,12,16,24")
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args()
    b = boot(a.model, sched=SchedOptions.resolve(env=False), scheduler=False, show=False)
    model = b.model
    warmup(model)
    lanes_list = [int(x) for x in a.lanes.split(",")]
    extras = [int(x) for x in a.extra.split(",")]
    sessions = [Session(model) for _ in range(max(lanes_list))]
    rng = np.random.default_rng(0)
    for s in sessions:
        s.prefill(rng.integers(100, 5000, size=a.context).tolist())
    timed(sessions[:1], [1], 3)  # warm
    cost = measure(model)
    print(f"step costs (ms): {cost}")
    print(f"{a.model}, {a.context} tokens of context a lane; median of {a.reps}")
    print(f"{'lanes':>5} {'extra':>5} {'rows':>4} {'ms':>7} {'model':>7} {'err':>6}")
    for lanes in lanes_list:
        for d in extras:
            rows = [1] * lanes
            for i in range(d):  # drafts spread over the lanes, longest first (the choice fills lanes in turn)
                rows[i % lanes] += 1
            ms = timed(sessions[:lanes], rows, a.reps)
            pred = cost(lanes + d, sum(rows_reach(s.length, r) for r, s in zip(rows, sessions, strict=False)), lanes)
            print(f"{lanes:>5} {d:>5} {lanes + d:>4} {ms:7.1f} {pred:7.1f} {100 * (pred / ms - 1):+5.0f}%")


if __name__ == "__main__":
    main()
