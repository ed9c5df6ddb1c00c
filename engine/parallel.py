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

import ctypes  # noqa: E402

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


_BLAS_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
                 "openblas_set_num_threads")


def set_blas_threads(n: int) -> bool:
    """Set the thread count of every OpenBLAS loaded in this process (numpy's); False if none found.

    BLAS worker threads busy-wait between calls; next to numba's team on 2 cores they starve each
    other (measured on Gemma 270M prefill of 6 tokens: 5.0 s with 2 BLAS threads, 0.18 s with 1)."""
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split()[-1] for line in fh if "openblas" in line.lower() and ".so" in line}
    except OSError:
        return False
    done = False
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _BLAS_SETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(ctypes.c_int(n))
                done = True
                break
    return done


def _default_blas_threads() -> None:
    # An explicit user setting wins; FAK_BLAS_THREADS overrides our default of 1.
    if any(os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")) and not os.environ.get("FAK_BLAS_THREADS"):
        return
    set_blas_threads(int(os.environ.get("FAK_BLAS_THREADS", "1")))


_default_blas_threads()
