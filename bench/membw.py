"""Stream-read ceiling: numba threads summing a buffer far larger than the caches (GB/s, medians).

    python bench/membw.py [--mib 512] [--reps 7] [--json PATH]

--json PATH also writes the figures there as JSON (bench/report.py draws them).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numba

from engine.model.diag import stream_read_gbps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    a = ap.parse_args()
    gbps_by_threads: dict[int, float] = {}
    for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
        numba.set_num_threads(threads)
        gbps = stream_read_gbps(a.mib << 20, a.reps)
        print(f"stream read, {threads} thread(s), {a.mib} MiB: {gbps:.2f} GB/s")
        gbps_by_threads[threads] = gbps
    if a.json:
        Path(a.json).write_text(json.dumps({"bench": "membw", "mib": a.mib, "reps": a.reps,
                                            "gbps_by_threads": gbps_by_threads}, indent=1))


if __name__ == "__main__":
    main()
