"""Rate limits for a policy: one token bucket per rule (shared by the tools it names)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class RateLimit:
    id: str
    tools: frozenset[str] | None  # None = every tool
    per_minute: float
    burst: int
    clock: Callable[[], float] = time.monotonic
    _tokens: float = field(default=-1.0, repr=False)
    _stamp: float = field(default=0.0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take(self) -> float | None:
        """Spend one token: None if allowed, else the seconds until a token is back."""
        rate = self.per_minute / 60.0
        with self._lock:
            now = self.clock()
            if self._tokens < 0:  # first use: a full bucket
                self._tokens, self._stamp = float(self.burst), now
            self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * rate)
            self._stamp = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return None
            return (1.0 - self._tokens) / rate if rate > 0 else float("inf")
