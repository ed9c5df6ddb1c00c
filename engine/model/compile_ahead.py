"""A cold first run compiles the single-lane kernel in a second process while this one compiles the rest.

numba compiles one function at a time in a process (a process-wide lock), so a cold warmup keeps one
core busy. The lane kernel (engine/kernels/lane_kernel.py) is its biggest piece and shares little with
the rest: Gemma 3 270M's cold warmup measured 36 s, 16 of them lane_layers. When numba's cache holds no
lane kernel, `warmup` starts a Python process running engine.model.session.warm_lane_kernel (a one-token
prefill of the synthetic resident checkpoint: one row, the lane kernel with the head), which leaves it in
numba's cache; this process compiles everything else meanwhile, then waits for it and loads
the kernel from the cache. A helper that fails or is killed costs only time: this process then compiles
the kernel itself. `FAK_COMPILE_AHEAD=0` turns it off. The helper's span is a "fak:compile-ahead" event
(numba.core.event), which the first run's progress rows show.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from numba.core import event

KIND = "fak:compile-ahead"
HELPER = "import sys; from engine.model.session import warm_lane_kernel; warm_lane_kernel(sys.argv[1])"
TIMEOUT_S = 600.0  # a helper still compiling after this is killed (this process then compiles itself)


def lane_kernel_cached() -> bool:
    """Does numba's cache hold a lane kernel (any signature)? Unknown counts as yes: no helper."""
    try:
        from engine.kernels.lane_kernel import lane_layers

        return Path(lane_layers._cache._cache_file._index_path).exists()
    except Exception:  # noqa: BLE001  (numba's cache layout is not API: never spawn on a guess)
        return True


@dataclass
class Ahead:
    """A compile helper in flight (proc None: none was started)."""

    proc: subprocess.Popen[bytes] | None = None
    started: float = field(default_factory=time.perf_counter)

    def wait(self) -> bool:
        """Wait for the helper (bounded); True if it finished cleanly. Idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return False
        try:
            ok = proc.wait(timeout=max(1.0, TIMEOUT_S - (time.perf_counter() - self.started))) == 0
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            ok = False
        finally:
            event.end_event(KIND, data={"group": "lane_kernel", "kernel": "lane_layers"})
        return ok


def start(kv_dtype: str) -> Ahead:
    """Start the helper if the lane kernel is not cached (and FAK_COMPILE_AHEAD is not 0)."""
    if os.environ.get("FAK_COMPILE_AHEAD", "1") == "0" or lane_kernel_cached():
        return Ahead()
    root = str(Path(__file__).resolve().parents[2])  # the engine package's parent: the same engine imports
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    try:
        proc = subprocess.Popen([sys.executable, "-c", HELPER, kv_dtype], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return Ahead()
    event.start_event(KIND, data={"group": "lane_kernel", "kernel": "lane_layers (a second process)"})
    return Ahead(proc)
