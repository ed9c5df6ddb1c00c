"""/metrics: vLLM's request metrics under the `fak_` prefix (same names after it, a `model_name`
label), the scheduler's `fak_sched_*` families, the kernel's `fak_kernel_*` counters (tool calls
submitted, denied, transformed, quarantined, dispatched) and per-route HTTP counts and latencies."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _Gauges:
    """running / waiting / kv_cache_usage_perc read from the latest scheduler snapshot on scrape."""

    def __init__(self, stats: Callable[[], Any], model: str) -> None:
        self._stats, self._model = stats, model

    def describe(self) -> list[object]:
        return []

    def collect(self) -> Iterator[object]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self._stats()
        if s is None:
            return
        for name, doc, value, kind in (
            ("fak_num_requests_running", "Requests prefilling or decoding", s.running, "gauge"),
            ("fak_num_requests_waiting", "Requests waiting to be scheduled", s.waiting + s.preempted, "gauge"),
            # as vLLM counts it: blocks held by lanes (cached-only blocks are free to evict) over the pool
            ("fak_kv_cache_usage_perc", "KV-cache usage: 1 means 100 percent",
             (s.used_blocks - s.reclaimable_blocks) / max(s.max_blocks or s.pool_blocks, 1), "gauge"),
            ("fak_num_preemptions", "Preemptions (swap and recompute)", s.preemptions_swap + s.preemptions_recompute,
             "counter"),
            # counted in lookups (vLLM counts tokens; fak_sched_prefix_hit_tokens has the tokens)
            ("fak_prefix_cache_queries", "Prefix-cache lookups", s.prefix_queries, "counter"),
            ("fak_prefix_cache_hits", "Prefix-cache lookups that found blocks", s.prefix_hits, "counter"),
        ):
            family = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
            g = family(name, doc, labels=["model_name"])
            g.add_metric([self._model], float(value))
            yield g


class _KernelCounters:
    """The kernel's Counters (fak.core.kernel), read on scrape: one fak_kernel_<name>_total per field."""

    DOCS = {"submits": "Tool calls submitted to the kernel", "engine_calls": "Tool calls dispatched to an engine",
            "denies": "Tool calls denied", "transforms": "Tool calls whose arguments a policy rewrote",
            "quarantines": "Tool results withheld (quarantined)", "result_denies": "Tool results denied"}

    def __init__(self, kernel: Callable[[], Any]) -> None:
        self._kernel = kernel

    def describe(self) -> list[object]:
        return []

    def collect(self) -> Iterator[object]:
        from prometheus_client.core import CounterMetricFamily

        k = self._kernel()
        if k is None:
            return
        for name, value in k.stats().items():
            yield CounterMetricFamily(f"fak_kernel_{name}", self.DOCS.get(name, name), value=float(value))


class Metrics:
    def __init__(self, model: str, stats: Callable[[], Any], kernel: Callable[[], Any] = lambda: None) -> None:
        from engine.sched.stats import SchedCollector

        self.model = model
        self.registry = CollectorRegistry()
        self.registry.register(_Gauges(stats, model))
        self.registry.register(_KernelCounters(kernel))
        self.registry.register(SchedCollector(lambda: stats() or _empty()))
        r, m = self.registry, ["model_name"]
        self.prompt_tokens = Counter("fak_prompt_tokens", "Prompt tokens processed", m, registry=r)
        self.generation_tokens = Counter("fak_generation_tokens", "Tokens generated", m, registry=r)
        self.success = Counter("fak_request_success", "Finished requests", m + ["finished_reason"], registry=r)
        self.ttft = Histogram("fak_time_to_first_token_seconds", "Time to first token", m, buckets=_LATENCY, registry=r)
        self.e2e = Histogram("fak_e2e_request_latency_seconds", "End-to-end request latency", m, buckets=_LATENCY,
                             registry=r)
        self.itl = Histogram("fak_inter_token_latency_seconds", "Time between consecutive tokens of a request", m,
                             buckets=_LATENCY, registry=r)
        self.queue = Histogram("fak_request_queue_time_seconds", "Time a request waited before it was scheduled", m,
                               buckets=_LATENCY, registry=r)
        sizes = (1, 8, 32, 128, 512, 2048, 8192, 32768)
        self.req_prompt = Histogram("fak_request_prompt_tokens", "Prompt tokens per request", m, buckets=sizes,
                                    registry=r)
        self.req_gen = Histogram("fak_request_generation_tokens", "Generated tokens per request", m, buckets=sizes,
                                 registry=r)
        self.http = Counter("fak_http_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.http_latency = Histogram("fak_http_request_duration_seconds", "HTTP handler latency", ["route"],
                                      buckets=_LATENCY, registry=r)

    def request_counts(self) -> tuple[float, float]:
        """HTTP requests served so far, and how many of them were server errors: 5xx, but not /health's 503
        while the model loads (a readiness probe told "not yet" is no failure; a panel counting every poll
        of it as an error alarmed for nothing). /metrics keeps every status as it was."""
        total = errors = 0.0
        for m in self.http.collect():
            for sample in m.samples:
                if sample.name.endswith("_total"):
                    total += sample.value
                    status, route = sample.labels.get("status", ""), sample.labels.get("route", "")
                    if status.startswith("5") and not (route == "/health" and status == "503"):
                        errors += sample.value
        return total, errors

    def finished(self, result: Any) -> None:
        """Account one finished choice (a LaneResult)."""
        m = self.model
        self.prompt_tokens.labels(m).inc(result.prompt_tokens)
        self.generation_tokens.labels(m).inc(len(result.token_ids))
        self.success.labels(m, result.finish_reason.value).inc()
        if result.ttft_s is not None:
            self.ttft.labels(m).observe(result.ttft_s)
        if result.queue_s is not None:
            self.queue.labels(m).observe(result.queue_s)
        self.e2e.labels(m).observe(result.latency_s)
        self.req_prompt.labels(m).observe(result.prompt_tokens)
        self.req_gen.labels(m).observe(len(result.token_ids))
        itl = self.itl.labels(m)
        for gap in result.itl_s:
            itl.observe(gap)


def _empty() -> Any:
    from engine.sched.stats import SchedStats

    return SchedStats()
