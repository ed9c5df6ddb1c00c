"""Cache-aware routing of requests to decode workers (SGLang's router, over fak's block hashes).

The router keeps each worker's resident prefix blocks as a set of chain hashes, fed by the workers' prefix
cache add/evict events. A request goes to the worker holding the longest run of its leading block hashes,
unless load is imbalanced: (max - min queue length) > balance_abs AND max > balance_rel * min; then, and
when no worker holds anything, to the least-loaded worker. The view is advisory: a lost event costs a cold
route (the decode worker's own reserve() says what it really holds), never a wrong KV.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class Route:
    worker: str
    matched: int  # leading blocks the router believes the worker holds
    reason: str  # "prefix" | "least-loaded" | "balance"


class Router:
    def __init__(self, workers: list[str], *, balance_abs: int = 4, balance_rel: float = 1.5) -> None:
        if not workers:
            raise ValueError("a router needs at least one worker")
        self.workers = list(workers)
        self.balance_abs, self.balance_rel = balance_abs, balance_rel
        self._resident: dict[str, set[int]] = {w: set() for w in workers}
        self._lock = threading.Lock()
        self.counts = {"prefix": 0, "least-loaded": 0, "balance": 0}

    def publish(self, worker: str, kind: str, hashes: list[int]) -> None:
        """A worker's residency event: kind "add" or "evict" of these block hashes."""
        with self._lock:
            s = self._resident.get(worker)
            if s is None:
                return
            if kind == "add":
                s.update(hashes)
            elif kind == "evict":
                s.difference_update(hashes)

    def down(self, worker: str) -> None:
        """Stop routing to a worker (dead or unreachable); its residency view goes with it."""
        with self._lock:
            if worker in self.workers and len(self.workers) > 1:
                self.workers.remove(worker)
            elif worker in self.workers:
                self.workers = []
            self._resident[worker] = set()

    def up(self, worker: str) -> None:
        """Route to a worker again (it came back, with an empty cache)."""
        with self._lock:
            if worker not in self.workers:
                self.workers.append(worker)
            self._resident[worker] = set()

    def forget(self, worker: str) -> None:
        """Drop a worker's residency view (restarted or lost)."""
        with self._lock:
            if worker in self._resident:
                self._resident[worker] = set()

    def matched(self, worker: str, hashes: list[int]) -> int:
        """Leading hashes of a prompt that the worker is believed to hold."""
        with self._lock:
            s = self._resident[worker]
            n = 0
            for h in hashes:
                if h not in s:
                    break
                n += 1
            return n

    def imbalanced(self, loads: dict[str, int]) -> bool:
        hi, lo = max(loads.values()), min(loads.values())
        return hi - lo > self.balance_abs and hi > self.balance_rel * lo

    def route(self, hashes: list[int], loads: dict[str, int]) -> Route:
        """Where a prompt with these leading block hashes goes, given each worker's queue length."""
        if not self.workers:
            raise LookupError("no decode worker is up")
        loads = {w: loads.get(w, 0) for w in self.workers}
        least = min(self.workers, key=lambda w: loads[w])  # ties: the first worker
        if self.imbalanced(loads):
            r = Route(least, self.matched(least, hashes), "balance")
        else:
            best = max(self.workers, key=lambda w: (self.matched(w, hashes), -loads[w]))
            n = self.matched(best, hashes)
            r = Route(best, n, "prefix") if n > 0 else Route(least, 0, "least-loaded")
        self.counts[r.reason] += 1
        return r
