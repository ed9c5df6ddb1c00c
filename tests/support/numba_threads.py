"""Evidence that a test's kernels ran on more than one thread (the twin == parallel and batch-invariance
claims are about threads: on one thread they would hold trivially).

`team_size()`: how many distinct numba workers a parallel region launched from the calling thread
runs on, from `numba.get_thread_id()` inside a prange loop (numba's thread count is per thread: the
scheduler's loop thread has its own). `ParallelLaunches`: every `engine.kernels.parallel.launch` in
the engine, recording whether it ran the parallel kernel (it did not ask for the serial twin), the
launching thread, its numba thread count and its measured team size (twin launches are only counted).
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import pytest

import engine.kernels.parallel as P


@numba.njit(parallel=True, cache=True)
def _worker_ids(n: int) -> np.ndarray:  # pragma: no cover - numba
    out = np.empty(n, dtype=np.int64)
    for i in numba.prange(n):
        out[i] = numba.get_thread_id()
    return out


def team_size() -> int:
    """Distinct numba threads that ran a 64-iteration parallel loop launched from this thread."""
    return int(np.unique(_worker_ids(64)).size)


@dataclass(frozen=True)
class Launch:
    kernel: str
    parallel: bool  # the parallel kernel ran (launch did not take the serial twin)
    thread: str  # the launching Python thread
    num_threads: int  # numba.get_num_threads() in that thread at the call
    team: int  # team_size() measured in that thread


class ParallelLaunches:
    """Patch `launch` wherever engine modules imported it, and `serial_twin` inside it, to record; a
    context manager (or start() / stop(): the wrapper costs ~1 us a launch, so long tests stop early)."""

    def __init__(self) -> None:
        self._mp = pytest.MonkeyPatch()
        self.launches: list[Launch] = []  # the launches that ran the parallel kernel
        self.twins = 0  # launches that ran the serial twin (approximate under threads: not locked)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._teams: dict[int, int] = {}
        real_launch, real_twin = P.launch, P.serial_twin

        def twin(kernel: Any) -> Any:
            self._local.twin = True
            return real_twin(kernel)

        def launch(kernel: Any, work: int, *args: Any) -> None:
            local = self._local
            local.twin = False
            real_launch(kernel, work, *args)
            if local.twin:  # the serial twin ran: counted, not described (the hot path of small work)
                self.twins += 1
                return
            ident = threading.get_ident()
            if ident not in self._teams:
                self._teams[ident] = team_size()
            rec = Launch(kernel.__name__, True, threading.current_thread().name, numba.get_num_threads(),
                         self._teams[ident])
            with self._lock:
                self.launches.append(rec)

        self._twin, self._launch, self._real = twin, launch, real_launch

    def start(self) -> ParallelLaunches:
        self._mp.setattr(P, "serial_twin", self._twin)
        for name, mod in list(sys.modules.items()):
            if name.startswith("engine.") and getattr(mod, "launch", None) is self._real:
                self._mp.setattr(mod, "launch", self._launch)
        return self

    def stop(self) -> None:
        self._mp.undo()

    def __enter__(self) -> ParallelLaunches:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def parallel(self, thread: str | None = None) -> list[Launch]:
        with self._lock:
            return [r for r in self.launches if r.parallel and (thread is None or r.thread == thread)]

    def assert_multithreaded(self, thread: str | None = None) -> None:
        """Some launch ran the parallel kernel, and every one that did ran on a team of >= 2 threads."""
        par = self.parallel(thread)
        assert par, f"no parallel kernel ran{f' on {thread}' if thread else ''}: the test proves nothing about threads"
        narrow = [r for r in par if r.num_threads < 2 or r.team < 2]
        assert not narrow, f"parallel kernels ran on one thread: {narrow[:3]}"
