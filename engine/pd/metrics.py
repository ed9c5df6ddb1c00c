"""Prometheus `fak_pd_*` metrics over a P/D cluster's `stats()` dict (engine/pd/cluster.py): per worker its
role, requests, KV imports, blocks and bytes moved, blocks skipped thanks to residency, import time, and the
router's routes by reason. The collector reads the dict on each scrape; it keeps no state of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def decode_workers(stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The decode workers' entries of a cluster's stats(), by name (sorted)."""
    return {k: v for k, v in sorted(stats.items()) if isinstance(v, dict) and v.get("role") == "decode"}


class PDCollector:
    """prometheus_client custom collector over a `() -> PDCluster.pd_stats()` callable (register it yourself)."""

    def __init__(self, stats: Callable[[], dict[str, Any]], prefix: str = "fak_pd") -> None:
        self._stats = stats
        self._p = prefix

    def describe(self) -> list[object]:
        return []  # unchecked collector: metrics are produced on collect()

    def collect(self) -> Iterator[object]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s, p = self._stats(), self._p
        pre, dec = s.get("prefill", {}), decode_workers(s)

        def family(kind: type, name: str, doc: str, labels: list[str],
                   rows: list[tuple[list[str], float]]) -> Any:
            m = kind(f"{p}_{name}", doc, labels=labels)
            for values, v in rows:
                m.add_metric(values, v)
            return m

        C, G = CounterMetricFamily, GaugeMetricFamily
        roles = [(["prefill", "prefill"], 1.0)] if pre else []
        yield family(G, "worker", "A P/D worker (always 1), by name and role", ["worker", "role"],
                     roles + [([n, "decode"], 1.0) for n in dec])
        reqs = ([(["prefill", "prefill"], pre.get("requests", 0))] if pre else []) + \
               [([n, "decode"], w.get("requests", 0)) for n, w in dec.items()]
        yield family(C, "requests", "Requests handled (prefilled; routed to and sent to a decode worker)",
                     ["worker", "role"], reqs)
        ptok = ([(["prefill", "prefill"], pre.get("prefill_tokens", 0))] if pre else []) + \
               [([n, "decode"], w.get("prefill_tokens", 0)) for n, w in dec.items()]
        yield family(C, "prefill_tokens", "Prompt tokens prefilled (on a decode worker: should stay 0)",
                     ["worker", "role"], ptok)
        if pre:
            yield C(f"{p}_prefill_hit_tokens", "Prompt tokens the prefill worker took from its own prefix cache",
                    value=pre.get("hit_tokens", 0))
            yield C(f"{p}_exported_blocks", "KV blocks exported by the prefill worker", value=pre.get("blocks_out", 0))
            yield C(f"{p}_exported_bytes", "KV frame bytes exported by the prefill worker",
                    value=pre.get("bytes_out", 0))

        def per_decode(kind: type, name: str, doc: str, key: str) -> Any:
            return family(kind, name, doc, ["worker"], [([n], w.get(key, 0)) for n, w in dec.items()])

        yield per_decode(C, "imports", "KV frames imported and admitted by a decode worker", "imports")
        yield per_decode(C, "import_refused", "KV frames a decode worker refused or failed to import", "refused")
        yield per_decode(C, "blocks_moved", "KV blocks sent to a decode worker", "blocks")
        yield per_decode(C, "bytes_moved", "KV frame bytes sent to a decode worker", "bytes")
        yield per_decode(C, "blocks_skipped", "Leading prompt blocks not computed nor moved: already resident on "
                                              "the decode worker", "skipped_blocks")
        yield per_decode(C, "held_blocks", "Resident blocks a decode worker reserved for incoming requests",
                         "held_blocks")
        yield per_decode(C, "import_waits", "Import retries while a fixed KV pool had no room", "import_waits")
        yield per_decode(C, "transfer_seconds", "Time importing frames on a decode worker (queueing on its loop "
                                                "thread included)", "transfer_s")
        yield family(G, "transfer_seconds_mean", "Mean import time per imported frame", ["worker"],
                     [([n], w.get("transfer_s", 0.0) / w["imports"] if w.get("imports") else 0.0)
                      for n, w in dec.items()])
        yield family(C, "routes", "Router decisions, by reason (prefix: the longest resident prefix; least-loaded: "
                                  "no worker held any; balance: load imbalance overrode the prefix)",
                     ["reason"], [([r], n) for r, n in sorted(s.get("router", {}).items())])
