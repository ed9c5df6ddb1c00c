"""PipelinedScheduler: several NativeSchedulers over one pipeline, so every stage has work.

One scheduler's forward is synchronous: its lanes sit in one stage at a time while the others wait. With
N groups (one NativeScheduler each, its own KV pool on every stage), N forwards are in flight at once:
while stage 2 runs group A's step, stage 1 runs group B's, and the head samples group C's logits
(micro-batches across steps, each group reading every weight once per step). A request goes to the group
whose prefix cache holds the longest run of its prompt blocks, else the least loaded (engine/sched/router.py,
the P/D router over the groups' cache events). The groups' figures are summed as one scheduler's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from engine.errors import EngineError
from engine.pipeline.metrics import PipelineCollector, pipeline_stats
from engine.sched.api import Topology
from engine.sched.lane import Handle, LaneResult, Request
from engine.sched.prefix_cache import chain_hashes, shareable_blocks
from engine.sched.router import Router
from engine.sched.scheduler import NativeScheduler
from engine.sched.stats import SchedStats, merge_stats

T = TypeVar("T")


class PipelinedScheduler:
    def __init__(self, model: Any, groups: int = 0, **sched_kwargs: Any) -> None:
        n = groups or len(model.pipeline.stages)
        if n < 1:
            raise EngineError(f"pipeline groups must be >= 1, got {n}")
        kw = dict(sched_kwargs)
        if kw.get("kv_blocks") is not None:  # the budget is the server's: shared out between the groups
            if kw["kv_blocks"] < n:
                raise EngineError(f"--kv-blocks {kw['kv_blocks']} cannot be split between {n} pipeline groups")
            kw["kv_blocks"] = kw["kv_blocks"] // n
        if kw.get("max_running"):
            kw["max_running"] = max(1, -(-kw["max_running"] // n))
        self.model = model
        self.names = [f"group-{i}" for i in range(n)]
        self.router = Router(self.names)
        self.groups: dict[str, NativeScheduler] = {}
        self._load = dict.fromkeys(self.names, 0)
        self._lock = threading.Lock()
        self._on_finish: Callable[[LaneResult], None] | None = None
        for name in self.names:
            s = NativeScheduler(model, **kw)
            if s.prefix is not None:
                s.prefix.listener = lambda kind, hs, name=name: self.router.publish(name, kind, hs)
            s.on_finish = lambda r, name=name: self._finished(name, r)
            self.groups[name] = s
        first = self.groups[self.names[0]]
        self.tokenizer = first.tokenizer
        self.block_tokens = first.pool.block_tokens

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Every group's loop thread has loaded its kernels (NativeScheduler(warm=True))."""
        return all(s.warmed.wait(timeout) for s in self.groups.values())

    # -- the scheduler API the server uses
    def admit(self, request: Request) -> Handle:
        first = self.groups[self.names[0]]
        ids = first._validate(request)
        hashes = chain_hashes(ids, self.block_tokens, shareable_blocks(ids, self.block_tokens), request.scope)
        with self._lock:
            name = self.router.route(hashes, self._load).worker
            self._load[name] += 1
        try:
            return self.groups[name].admit(request)
        except BaseException:
            with self._lock:
                self._load[name] -= 1
            raise

    def _finished(self, name: str, result: LaneResult) -> None:
        with self._lock:
            self._load[name] = max(0, self._load[name] - 1)
        if self._on_finish is not None:
            self._on_finish(result)

    @property
    def on_finish(self) -> Callable[[LaneResult], None] | None:
        return self._on_finish

    @on_finish.setter
    def on_finish(self, fn: Callable[[LaneResult], None] | None) -> None:
        self._on_finish = fn

    def stats(self) -> SchedStats:
        return merge_stats([s.stats() for s in self.groups.values()], self.block_tokens)

    def loads(self) -> dict[str, int]:
        with self._lock:
            return dict(self._load)

    def topology(self) -> Topology:
        """Always "pipeline": the groups share one pipeline."""
        return Topology("pipeline", pipeline=self._pipeline_stats)

    def collectors(self) -> list[object]:
        """The fak_pipeline_* families."""
        return [PipelineCollector(self._pipeline_stats)]

    def _pipeline_stats(self) -> dict[str, Any]:
        return pipeline_stats(self.model.pipeline)

    def call(self, fn: Callable[[], T]) -> Future[T]:
        return self.groups[self.names[0]].call(fn)

    def grammar_compiler(self) -> Any:
        return self.groups[self.names[0]].grammar_compiler()

    def warm_grammar(self) -> None:
        self.groups[self.names[0]].warm_grammar()

    @property
    def kv_blocks(self) -> int | None:
        kv = [s.kv_blocks for s in self.groups.values()]
        return None if None in kv else sum(kv)  # type: ignore[arg-type]

    def close(self) -> None:
        for s in self.groups.values():
            s.close()

    def __enter__(self) -> PipelinedScheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
