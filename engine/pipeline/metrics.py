"""Prometheus `fak_pipeline_*` metrics over a Pipeline's figures (engine/pipeline/pipeline.py): per stage its step
time, busy time, utilisation and bubble fraction (the share of the pipeline's forward time the stage waited),
rows and bytes; for the head, forwards, and bytes and header bytes per decode step on the first link."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def pipeline_stats(pipeline: Any, fresh: bool = False) -> dict[str, Any]:
    """One JSON-able dict: the head's counters and each stage's figures (what /fak/stats, the panel and the
    collector read). `fresh=False` reads remote stages' last heartbeat (no round trip per scrape)."""
    st = dict(pipeline.stats)
    n = st.get("decode_forwards") or 0
    st["decode_bytes_per_step"] = st["decode_bytes"] / n if n else 0.0
    st["decode_header_bytes_per_step"] = st["decode_header_bytes"] / n if n else 0.0
    st["micro_batches"] = pipeline.micro_batches
    st["in_flight_max"] = pipeline.stats.get("in_flight_max", 0)
    st["transport"] = pipeline.transport
    return {"head": st, "stages": pipeline.stage_stats(fresh)}


class PipelineCollector:
    """prometheus_client custom collector over a `() -> pipeline_stats(...)` callable."""

    def __init__(self, stats: Callable[[], dict[str, Any]], prefix: str = "fak_pipeline") -> None:
        self._stats = stats
        self._p = prefix

    def describe(self) -> list[object]:
        return []

    def collect(self) -> Iterator[object]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s, p = self._stats(), self._p
        head, stages = s.get("head", {}), s.get("stages", [])

        def per_stage(kind: type, name: str, doc: str, value: Callable[[dict[str, Any]], float]) -> Any:
            m = kind(f"{p}_{name}", doc, labels=["stage", "layers"])
            for i, st in enumerate(stages):
                lo, hi = st.get("layers", [0, 0])
                m.add_metric([str(i), f"{lo}:{hi}"], float(value(st)))
            return m

        yield GaugeMetricFamily(f"{p}_stages", "Pipeline stages", value=len(stages))
        yield per_stage(CounterMetricFamily, "stage_steps", "Forward messages (micro-batches) a stage ran",
                        lambda st: st.get("steps", 0))
        yield per_stage(CounterMetricFamily, "stage_busy_seconds", "Time a stage spent computing",
                        lambda st: st.get("busy_s", 0.0))
        yield per_stage(GaugeMetricFamily, "stage_step_seconds", "Mean compute time per forward message",
                        lambda st: st.get("busy_s", 0.0) / st["steps"] if st.get("steps") else 0.0)
        yield per_stage(GaugeMetricFamily, "stage_utilisation", "Stage busy time / the pipeline's forward time",
                        lambda st: st.get("utilisation", 0.0))
        yield per_stage(GaugeMetricFamily, "bubble_fraction", "Share of the pipeline's forward time a stage waited",
                        lambda st: st.get("bubble", 0.0))
        yield per_stage(CounterMetricFamily, "stage_rows", "Hidden rows a stage ran", lambda st: st.get("rows", 0))
        yield per_stage(CounterMetricFamily, "stage_bytes_in", "Hidden-row bytes into a stage",
                        lambda st: st.get("bytes_in", 0))
        yield CounterMetricFamily(f"{p}_forwards", "Pipeline forwards (scheduler model calls)",
                                  value=head.get("forwards", 0))
        yield CounterMetricFamily(f"{p}_forward_seconds", "Wall time in pipeline forwards", value=head.get("wall_s", 0.0))
        yield GaugeMetricFamily(f"{p}_decode_bytes_per_step", "Hidden-row bytes per decode step on a stage link",
                                value=head.get("decode_bytes_per_step", 0.0))
        yield GaugeMetricFamily(f"{p}_decode_header_bytes_per_step", "Header bytes per decode step on a stage link",
                                value=head.get("decode_header_bytes_per_step", 0.0))
