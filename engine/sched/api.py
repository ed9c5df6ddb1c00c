"""ServingEngine: the one seam a server (fak/gateway) talks to, whatever runs behind it.

A single NativeScheduler, pipeline groups (engine/pipeline) and P/D heads or clusters (engine/pd) all
implement it, so the gateway never guesses at a scheduler's shape with hasattr/getattr and never imports
engine.pd or engine.pipeline: what is split, and its figures, come from `topology()`; the engine's own
Prometheus families from `collectors()`. This module imports neither package (they sit above sched).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from engine.sched.lane import Handle, LaneResult, Request
from engine.sched.stats import SchedStats

T = TypeVar("T")
KINDS = ("single", "pd", "pipeline")


@dataclass(frozen=True)
class Topology:
    """How an engine is split, with a snapshot callable per split (what /fak/stats, the console and the
    serve panel show). `pd`: the P/D per-worker dict (PDHead/PDCluster.pd_stats()); `pipeline`: the
    pipeline's head and stage figures (engine.pipeline.metrics.pipeline_stats). None where not split so."""

    kind: str  # "single" | "pd" | "pipeline"
    pd: Callable[[], dict[str, Any]] | None = None
    pipeline: Callable[[], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"topology kind is one of {', '.join(KINDS)}, not {self.kind!r}")


@runtime_checkable
class ServingEngine(Protocol):
    """What a server needs from an engine: admit requests and stream them (Handle), run model work on the
    engine's thread (call), read its figures (stats, topology, collectors), grammars, and close it."""

    tokenizer: Any
    on_finish: Callable[[LaneResult], None] | None  # observer of every finished request (metrics)

    def admit(self, request: Request) -> Handle: ...

    def call(self, fn: Callable[[], T]) -> Future[T]: ...

    def stats(self) -> SchedStats: ...

    def close(self) -> None: ...

    def warm_grammar(self) -> None: ...

    def grammar_compiler(self) -> Any: ...

    def topology(self) -> Topology: ...

    def collectors(self) -> list[Any]: ...


def split_stats(engine: ServingEngine | None) -> dict[str, dict[str, Any] | None]:
    """{"pd": P/D per-worker figures, "pipeline": head and stage figures} of an engine, each None where it is
    not split that way (or there is no engine yet): what /fak/stats, the console and `fak serve` show."""
    topo = engine.topology() if engine is not None else None
    return {"pd": topo.pd() if topo is not None and topo.pd is not None else None,
            "pipeline": topo.pipeline() if topo is not None and topo.pipeline is not None else None}


# A scheduler over a pipelined model (a P/D decode worker may be one) reports its pipeline, but engine/sched
# may not import engine/pipeline: the pipeline package registers how to read one when it is imported (it
# always is before a PipelineModel exists).
_pipeline_view: tuple[Callable[[Any], dict[str, Any]], Callable[[Callable[[], dict[str, Any]]], Any]] | None = None


def register_pipeline_view(stats: Callable[[Any], dict[str, Any]],
                           collector: Callable[[Callable[[], dict[str, Any]]], Any]) -> None:
    """`stats(pipeline) -> dict` and `collector(snapshot) -> prometheus collector` (engine/pipeline/__init__.py)."""
    global _pipeline_view
    _pipeline_view = (stats, collector)


def model_pipeline(model: Any) -> tuple[Topology, list[Any]]:
    """The topology and collectors of a scheduler over `model`: "pipeline" when it runs a pipeline, else
    "single" with none."""
    pipe = getattr(model, "pipeline", None)
    if pipe is None or _pipeline_view is None:
        return Topology("single"), []
    stats, collector = _pipeline_view
    snap = lambda: stats(pipe)  # noqa: E731
    return Topology("pipeline", pipeline=snap), [collector(snap)]
