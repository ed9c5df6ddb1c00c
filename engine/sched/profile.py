"""Where a scheduler iteration's time goes: wall time per phase, accumulated over iterations.

Off by default (NativeScheduler(profile=True) or FAK_SCHED_PROFILE=1): then the loop calls the no-op
`NO_PROFILE`, a method call per mark. Phases, in loop order:
  intake   new requests and cancels taken in          plan     admission, chunking, KV budget, batch
  forward  the model (prefill chunks, decode rows)    mask     grammar masks of constrained lanes
  sample   next-token choice per lane                 emit     stop checks, detokenization, hand-off
  prefix   prefix-cache upkeep                        publish  the stats snapshot
"""

from __future__ import annotations

import time
from dataclasses import dataclass

PHASES = ("intake", "plan", "forward", "mask", "sample", "emit", "prefix", "publish")


@dataclass(frozen=True)
class PhaseTime:
    phase: str
    ms_per_iteration: float
    share: float  # of the iteration's wall time


class IterationProfile:
    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.iterations = 0
        self._t = 0.0

    def start(self) -> None:
        self.iterations += 1
        self._t = time.perf_counter()

    def mark(self, phase: str) -> None:
        """Charge the time since the previous mark (or start) to `phase`."""
        t = time.perf_counter()
        self.seconds[phase] += t - self._t
        self._t = t

    def table(self) -> list[PhaseTime]:
        total = sum(self.seconds.values()) or 1.0
        n = max(self.iterations, 1)
        return [PhaseTime(p, 1e3 * s / n, s / total) for p, s in self.seconds.items()]

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.iterations = 0


class _NoProfile:
    def start(self) -> None:
        pass

    def mark(self, phase: str) -> None:
        pass


NO_PROFILE = _NoProfile()
