"""AMX tile products against vpdpwssd, side by side in one process: a decode step of L lanes and D extra rows.

    python bench/amx.py [--model qwen2.5-coder-0.5b] [--lanes 16] [--extra 0,16,32,48,64] [--context 500] [--rounds 6]

For each row count: one `forward_batch` of the lanes (each holding --context tokens of KV, every row asking
for logits), the product kernels bound with AMX on (engine/kernels/amxdot.py, from tilegemm.AMX_MIN_LANES
rows) and off, taking turns round by round (this shared host drifts 10-20% over minutes); the median of each
round's median of 3, and the ratio. The bits are the same either way (tests/engine/kernels/test_amxdot.py).
Without AMX (or FAK_AMX=0) there is nothing to compare: the script says so and stops.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time

import numpy as np

from engine.kernels import tilegemm as T
from engine.kernels.amxdot import amx_ready
from engine.kernels.parallel import specialised
from engine.model.session import Session, forward_batch, warmup
from engine.quant.tiles import kind_group
from fak.runtime.boot import SchedOptions, boot


def bind(amx: int) -> None:
    """gemm_tiles as the model's products call it (resident.py looks up T.gemm_for per call), AMX on or off."""
    T.gemm_for = functools.cache(lambda kind: specialised(T.gemm_tiles, KINDS_IN=kind_group(kind), AMX=amx))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--lanes", type=int, default=16)
    ap.add_argument("--extra", default="0,16,32,48,64")
    ap.add_argument("--context", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args()
    if not amx_ready():
        sys.exit("bench/amx.py: no AMX int8 tiles here (CPU, kernel or FAK_AMX=0): nothing to compare")
    b = boot(a.model, sched=SchedOptions.resolve(env=False), scheduler=False, show=False)
    warmup(b.model)
    pool = b.model.new_pool(None)
    sessions = [Session(b.model, pool) for _ in range(a.lanes)]
    rng = np.random.default_rng(0)
    for s in sessions:
        s.prefill(rng.integers(100, 5000, size=a.context).tolist())

    def step(rows: list[int]) -> float:
        base = [s.length for s in sessions]
        t = time.perf_counter()
        forward_batch(sessions, [[11 + i] * r for i, r in enumerate(rows)], rows)
        dt = time.perf_counter() - t
        for s, n in zip(sessions, base, strict=True):
            s.truncate(n)
        return dt

    print(f"{a.model}, {a.lanes} lanes of {a.context} tokens; median of {a.rounds} rounds, AMX and vpdpwssd in turn")
    print(f"{'rows':>5} {'AMX ms':>8} {'VNNI ms':>8} {'ratio':>6}")
    for d in (int(x) for x in a.extra.split(",")):
        rows = [1 + d // a.lanes + (i < d % a.lanes) for i in range(a.lanes)]
        got: dict[int, list[float]] = {1: [], 0: []}
        for _ in range(a.rounds):
            for amx in (1, 0):
                bind(amx)
                step(rows)
                got[amx].append(float(np.median([step(rows) for _ in range(3)])))
        on, off = (float(np.median(got[k])) * 1e3 for k in (1, 0))
        print(f"{sum(rows):>5} {on:8.1f} {off:8.1f} {off / on:5.2f}x")


if __name__ == "__main__":
    main()
