"""GEMV / small-GEMM speed of every resident block type on the same synthetic weight shape.

    python bench/kinds.py [--cols 2048] [--mbytes 64] [--lanes 1,16] [--reps 9]

Per type: resident bytes, then for each lane count the median time of `QuantWeight.matmul` as GB/s
of weight bytes streamed and as values x lanes per ns (the compute side at 16 lanes). The weight is
256 quantized random rows repeated to ~--mbytes (far past the caches), as fak q4kdiag --all-types
does. Types are measured in turn each round, so a noisy neighbour hits them alike. F32 is the float32
array a resident F32 matrix stays (and what F16 / BF16 matrices were before their tiles).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from engine.model.linear import matmul
from engine.model.resident import QUANT_TYPES, QuantWeight, resident_weight
from engine.quant.quantize import quantize_as


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--mbytes", type=int, default=64)
    ap.add_argument("--lanes", default="1,16")
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args()
    lanes = [int(v) for v in a.lanes.split(",")]
    rng = np.random.default_rng(0)
    weights: dict[str, QuantWeight | np.ndarray] = {}
    for qtype, name in QUANT_TYPES.items():
        raw = quantize_as(qtype, (rng.standard_normal((256, a.cols)) * 0.05).astype(np.float32))
        rows = max(256, (a.mbytes << 20) // raw.shape[1] // 256 * 256)
        w = resident_weight(name, qtype, np.tile(raw, (rows // 256, 1)), (rows, a.cols))
        assert isinstance(w, QuantWeight)
        weights[name] = w
    f32 = (rng.standard_normal((256, a.cols)) * 0.05).astype(np.float32)
    weights["F32"] = np.tile(f32, ((a.mbytes << 20) // f32.nbytes, 1))
    xs = {b: rng.standard_normal((b, a.cols)).astype(np.float32) for b in lanes}
    times: dict[tuple[str, int], list[float]] = {}
    for w in weights.values():  # compile / warm
        for b in lanes:
            matmul(xs[b], w)
    for _ in range(a.reps):
        for name, w in weights.items():
            for b in lanes:
                t0 = time.perf_counter()
                matmul(xs[b], w)
                times.setdefault((name, b), []).append(time.perf_counter() - t0)
    head = "".join(f"  {b:>2} lanes: GB/s  val*lane/ns" for b in lanes)
    print(f"{'type':<6} {'MiB':>6}{head}")
    for name, w in weights.items():
        cells = ""
        for b in lanes:
            sec = float(np.median(times[(name, b)]))
            cells += f"  {w.nbytes / sec / 1e9:>15.2f} {w.shape[0] * w.shape[1] * b / sec / 1e9:>12.2f}"
        print(f"{name:<6} {w.nbytes / 2**20:>6.1f}{cells}")


if __name__ == "__main__":
    main()
