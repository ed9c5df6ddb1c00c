"""Thread count per kernel call: small work runs on one thread.

numba parallel regions cost a thread-team wake-up each; a tiny model's step is ~60 of them and
on a busy 2-core box that wake-up can take milliseconds. The kernel code is the same whatever
the thread count (prange only splits the outer loop), so results do not change with it.
"""

from __future__ import annotations

import os
from typing import Any, Callable

# Idle OpenMP workers spin by default; on a shared 2-core box spinning threads starve the one
# doing work (measured: decode 0.8 -> 5 tok/s on Gemma 270M under load). Must be set before numba
# starts its OpenMP thread pool (the first parallel launch); an explicit user setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numba  # noqa: E402

SMALL_WORK = 1 << 18  # multiply-adds below which one thread is faster than waking a team
_MAX = numba.config.NUMBA_NUM_THREADS


def launch(kernel: Callable[..., Any], work: int, *args: Any) -> None:
    """Call a numba parallel kernel with 1 thread for small work, all threads otherwise."""
    if work < SMALL_WORK or _MAX == 1:
        prev = numba.get_num_threads()
        numba.set_num_threads(1)
        try:
            kernel(*args)
        finally:
            numba.set_num_threads(prev)
    else:
        kernel(*args)
