"""Stream-read ceiling: numba threads summing a buffer far larger than the caches (GB/s, medians).

    python bench/membw.py [--mib 512] [--reps 7]
"""

from __future__ import annotations

import argparse

import numba

from engine.model.diag import stream_read_gbps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
        numba.set_num_threads(threads)
        gbps = stream_read_gbps(a.mib << 20, a.reps)
        print(f"stream read, {threads} thread(s), {a.mib} MiB: {gbps:.2f} GB/s")


if __name__ == "__main__":
    main()
