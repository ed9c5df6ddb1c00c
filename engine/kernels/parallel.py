"""Thread count per kernel call: small work runs on one thread, without the thread team.

numba parallel regions cost a thread-team wake-up each. Worse, a parallel kernel run with
numba.set_num_threads(1) costs ~190 us per call on this box (measured: a 256x640 Q8_0 GEMV takes
27 us on the team of 2, 190 us with the team set to 1, 11 us as a plain serial function). So small
work runs the kernel's serial twin: the same Python source compiled without `parallel` (prange is
then range), so results do not change with the choice.

Launch parallel kernels from ONE thread per process (the scheduler's loop thread when serving): each
thread that enters a parallel region gets its own OpenMP team, and two live teams on 2 cores slow each
other (Gemma 270M single-lane decode: 80 tok/s from one thread; 52 from a second thread once the first
had launched regions during load). The serial twins release the GIL and run from any thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

# Idle OpenMP workers: a decode step is ~150 kernel calls with gaps of microseconds, and a sleeping
# worker takes tens of microseconds to wake (OMP_WAIT_POLICY=PASSIVE: 41-48 tok/s on Gemma 270M);
# spinning forever starves other work on a shared 2-core box (measured earlier: 0.8 vs 5 tok/s
# under load). A bounded spin (libgomp's GOMP_SPINCOUNT) keeps the team awake across a step and lets
# it sleep between requests: 50-58 tok/s, bench/decode.py. Must be set before numba starts its
# OpenMP pool (the first parallel launch); an explicit user setting of either variable wins.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "30000"

import contextlib  # noqa: E402
import ctypes  # noqa: E402
import threading  # noqa: E402
import types  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import numba  # noqa: E402

# Fast-math without `reassoc`: sums stay in the order written, so a kernel's serial twin and its
# parallel form give the same bits whatever each compilation vectorises (tests/engine/kernels/test_twins.py).
ORDERED_FASTMATH = {"nnan", "ninf", "nsz", "contract"}
SMALL_WORK = 1 << 18  # multiply-adds below which one thread is faster than waking a team
_MAX = numba.config.NUMBA_NUM_THREADS


_TWINS: dict[Any, Any] = {}
_SPECIALS: dict[tuple[Any, tuple[tuple[str, int], ...]], Any] = {}
_copies_lock = threading.Lock()


def _copy(kernel: Any, suffix: str, env: dict[str, Any], opts: dict[str, Any]) -> Any:
    """The kernel's Python function as a new numba dispatcher reading globals from `env`. numba's cache
    file is named after the qualname (its index ignores `parallel` and the globals' values): a distinct
    qualname keeps each copy's compilations from overwriting another's."""
    f = kernel.py_func
    g = types.FunctionType(f.__code__, env, f.__name__ + suffix, f.__defaults__, f.__closure__)
    g.__qualname__ = f.__qualname__ + suffix
    g.__module__ = f.__module__
    return numba.njit(cache=True, **opts)(g)


def serial_twin(kernel: Any) -> Any:
    """The kernel's source compiled without `parallel`, releasing the GIL (cached under its own name)."""
    twin = _TWINS.get(kernel)
    if twin is not None:
        return twin
    with _copies_lock:  # prefill workers may ask for the same twin at once
        twin = _TWINS.get(kernel)
        if twin is not None:
            return twin
        opts = {k: v for k, v in kernel.targetoptions.items() if k not in ("parallel", "nopython", "nogil")}
        # nogil: the prefill workers run twins side by side (QuantWeight._prefill_rows); they must
        # never `launch` big work themselves (a parallel region entered from two threads)
        twin = _TWINS[kernel] = _copy(kernel, "_twin", kernel.py_func.__globals__, dict(opts, nogil=True))
        return twin


def specialised(kernel: Any, **constants: int) -> Any:
    """The kernel compiled with some of its module's int globals bound to other values: numba freezes
    globals as compile-time literals, so each binding is a specialisation of its own (cached under its
    own name; its serial_twin binds the same). Dispatch stays numba's fast typed path, which a literal
    argument (numba.literally) would not: that re-types the function on every call with a plain int."""
    key = (kernel, tuple(sorted(constants.items())))
    spec = _SPECIALS.get(key)
    if spec is not None:
        return spec
    with _copies_lock:
        spec = _SPECIALS.get(key)
        if spec is None:
            suffix = "_" + "_".join(f"{k}{v}" for k, v in key[1])
            opts = {k: v for k, v in kernel.targetoptions.items() if k != "nopython"}
            spec = _SPECIALS[key] = _copy(kernel, suffix, dict(kernel.py_func.__globals__, **constants), opts)
        return spec


_warming = threading.local()


@contextlib.contextmanager
def warming() -> Iterator[None]:
    """Within this block every launch runs both the parallel kernel and its serial twin, so a
    warmup on tiny inputs loads both (every launched kernel only writes its `out` argument)."""
    prev = getattr(_warming, "on", False)
    _warming.on = True
    try:
        yield
    finally:
        _warming.on = prev


_launchers: set[int] = set()


def launchers() -> frozenset[int]:
    """The threads (idents) that have run a parallel kernel through `launch` in this process: one is the rule
    (the module's doc). A second costs every launch a worker's wake-up: with a kernel launch ~250 times a
    decode step, 16-lane decode ran 163 tok/s from three schedulers' threads and 212 from one."""
    return frozenset(_launchers)


def launch(kernel: Callable[..., Any], work: int, *args: Any) -> None:
    """Call a numba parallel kernel on all threads, or its serial twin for small work."""
    if getattr(_warming, "on", False):
        _launchers.add(threading.get_ident())
        kernel(*args)
        serial_twin(kernel)(*args)
    elif work < SMALL_WORK or _MAX == 1:
        serial_twin(kernel)(*args)
    else:
        _launchers.add(threading.get_ident())
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

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_failed = False  # BLAS could not be pinned to one thread: no pool, and do not look again


def prefill_workers() -> int:
    """Threads of the prefill pool (what its callers split their work for)."""
    return _MAX


def prefill_pool() -> ThreadPoolExecutor | None:
    """One worker per core for prefill, each running serial numba code and single-threaded BLAS on
    its own share (OpenBLAS and OpenMP teams spinning against each other on 2 cores cost 10x).
    None when there is one core, when FAK_PREFILL_THREADS=0, or when BLAS cannot be pinned."""
    global _pool, _pool_failed
    if _pool is not None or _pool_failed:
        return _pool
    with _pool_lock:
        if _pool is None and not _pool_failed:
            if _MAX > 1 and os.environ.get("FAK_PREFILL_THREADS", "1") != "0" and set_blas_threads(1):
                _pool = ThreadPoolExecutor(max_workers=_MAX, thread_name_prefix="fak-prefill")
            else:
                _pool_failed = True
        return _pool
