"""Scheduler statistics: an immutable snapshot (published by the loop thread, free to read) and a
Prometheus collector that turns the latest snapshot into `fak_sched_*` / `fak_sched_preempt_*` metrics.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields

from engine.model.kv import BlockPool
from engine.sched.preemption import Victim
from engine.sched.prefix_cache import PrefixCache


@dataclass(frozen=True)
class SchedStats:
    running: int = 0
    waiting: int = 0
    preempted: int = 0
    tokens_per_s: float = 0.0  # emitted tokens per second over the last few seconds
    used_blocks: int = 0
    max_blocks: int | None = None  # None: growable pool (no budget)
    cached_blocks: int = 0  # held by the prefix cache (part of used_blocks)
    reclaimable_blocks: int = 0  # cached and referenced by no lane
    pool_blocks: int = 0  # blocks the pool holds now (its budget when fixed; grows otherwise)
    block_tokens: int = 16
    steps: int = 0  # batched decode steps run
    tokens_generated: int = 0
    prefill_tokens: int = 0
    imported: int = 0  # lanes admitted already prefilled (admit_prefilled: P/D decode side)
    admitted: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # by finish reason
    preemptions_swap: int = 0
    preemptions_recompute: int = 0
    swap_bytes_out: int = 0
    swap_bytes_in: int = 0
    readmitted: int = 0
    last_victim: Victim | None = None
    prefix_queries: int = 0
    prefix_hits: int = 0
    prefix_hit_tokens: int = 0
    prefix_tainted_refused: int = 0  # offers of tainted spans the prefix cache refused (KV trust)
    kv_lost: int = 0  # lanes recomputed because their KV was lost (a pipeline stage restarted)
    # the prefix cache's disk tier (engine/wire/kv_disk.py); all 0 without one
    kv_disk_hits: int = 0  # blocks loaded from disk instead of prefilled
    kv_disk_bytes_read: int = 0
    kv_disk_bytes_written: int = 0
    kv_disk_evictions: int = 0
    kv_disk_refused: int = 0  # files that failed a check (corrupt, another model, another scope): not loaded
    kv_disk_files: int = 0
    kv_disk_bytes: int = 0
    kv_disk_enabled: int = 0  # 1 while blocks are being persisted
    # speculative decoding (engine/sched/draft.py); all 0 with --speculative off
    spec_drafted: int = 0  # draft tokens verified
    spec_accepted: int = 0  # of which the target emitted the same token
    spec_lane_steps: int = 0  # lane-steps that carried a draft
    spec_emitted: int = 0  # tokens those lane-steps emitted (accepted + the one after)
    speculative: str = "off"
    max_running_observed: int = 0
    max_running: int = 0  # configured limit, 0 = unbounded
    preempt_mode: str = "swap"
    victim_rule: str = "most-recent"

    def to_json(self) -> dict[str, object]:
        """Plain JSON types (the server's /fak/stats; `from_json` reads it back)."""
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, object]) -> SchedStats:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        if isinstance(kw.get("last_victim"), dict):
            kw["last_victim"] = Victim(**kw["last_victim"])  # type: ignore[arg-type]
        return cls(**kw)  # type: ignore[arg-type]


def snapshot(c: dict[str, int], finished: dict[str, int], last_victim: Victim | None, tokens_per_s: float, *,
             pool: BlockPool, prefix: PrefixCache | None, running: int, waiting: int, preempted: int,
             kv_blocks: int | None, max_running: int, preempt_mode: str, victim_rule: str,
             disk: object = None, speculative: str = "off") -> SchedStats:
    """Assemble the scheduler's published snapshot from its loop-thread counters and queues."""
    d = disk.stats() if disk is not None else None  # type: ignore[attr-defined]
    return SchedStats(
        running=running,
        waiting=waiting,
        preempted=preempted,
        tokens_per_s=tokens_per_s,
        used_blocks=pool.num_used,
        max_blocks=kv_blocks,
        cached_blocks=len(prefix) if prefix is not None else 0,
        reclaimable_blocks=prefix.reclaimable() if prefix is not None else 0,
        pool_blocks=pool.capacity,
        block_tokens=pool.block_tokens,
        steps=c["steps"],
        tokens_generated=c["tokens"],
        prefill_tokens=c["prefill_tokens"],
        imported=c.get("imported", 0),
        admitted=c["admitted"],
        finished=dict(finished),
        preemptions_swap=c["swap"],
        preemptions_recompute=c["recompute"],
        swap_bytes_out=c["bytes_out"],
        swap_bytes_in=c["bytes_in"],
        readmitted=c["readmitted"],
        last_victim=last_victim,
        prefix_queries=prefix.queries if prefix is not None else 0,
        prefix_hits=prefix.hits if prefix is not None else 0,
        prefix_hit_tokens=prefix.hit_tokens if prefix is not None else 0,
        prefix_tainted_refused=prefix.tainted_refused if prefix is not None else 0,
        kv_lost=c.get("kv_lost", 0),
        kv_disk_hits=d.hits if d else 0,
        kv_disk_bytes_read=d.bytes_read if d else 0,
        kv_disk_bytes_written=d.bytes_written if d else 0,
        kv_disk_evictions=d.evictions if d else 0,
        kv_disk_refused=d.refused if d else 0,
        kv_disk_files=d.files if d else 0,
        kv_disk_bytes=d.disk_bytes if d else 0,
        kv_disk_enabled=int(d.enabled) if d else 0,
        spec_drafted=c.get("spec_drafted", 0),
        spec_accepted=c.get("spec_accepted", 0),
        spec_lane_steps=c.get("spec_lane_steps", 0),
        spec_emitted=c.get("spec_emitted", 0),
        speculative=speculative,
        max_running_observed=c["max_running"],
        max_running=max_running,
        preempt_mode=preempt_mode,
        victim_rule=victim_rule,
    )


_SUMMED = ("running", "waiting", "preempted", "tokens_per_s", "used_blocks", "cached_blocks", "reclaimable_blocks",
           "pool_blocks", "steps", "tokens_generated", "prefill_tokens", "imported", "admitted", "preemptions_swap",
           "preemptions_recompute", "swap_bytes_out", "swap_bytes_in", "readmitted", "prefix_queries", "prefix_hits",
           "prefix_hit_tokens", "prefix_tainted_refused", "kv_lost", "max_running_observed", "max_running",
           "kv_disk_hits", "kv_disk_bytes_read", "kv_disk_bytes_written", "kv_disk_evictions", "kv_disk_refused",
           "kv_disk_files", "kv_disk_bytes", "kv_disk_enabled", "spec_drafted", "spec_accepted", "spec_lane_steps",
           "spec_emitted")


def merge_stats(snaps: list[SchedStats], block_tokens: int = 16, extra_waiting: int = 0) -> SchedStats:
    """Several schedulers seen as one (P/D decode workers, pipeline groups): counts and gauges summed, a
    budget only if every one has one, `extra_waiting` requests queued in front of them all."""
    if not snaps:
        return SchedStats(block_tokens=block_tokens, waiting=extra_waiting)
    total: dict[str, object] = {f: sum(getattr(s, f) for s in snaps) for f in _SUMMED}
    total["waiting"] = int(total["waiting"]) + extra_waiting  # type: ignore[call-overload]
    finished: dict[str, int] = {}
    for s in snaps:
        for k, v in s.finished.items():
            finished[k] = finished.get(k, 0) + v
    maxes = [s.max_blocks for s in snaps]
    last = [s.last_victim for s in snaps if s.last_victim is not None]
    return SchedStats(**total, max_blocks=None if None in maxes else sum(m or 0 for m in maxes),  # type: ignore[arg-type]
                      block_tokens=block_tokens, finished=finished, last_victim=last[-1] if last else None,
                      preempt_mode=snaps[0].preempt_mode, victim_rule=snaps[0].victim_rule,
                      speculative=snaps[0].speculative)


class RateMeter:
    """Events per second over a sliding window (loop thread only)."""

    def __init__(self, window_s: float = 3.0) -> None:
        self.window_s = window_s
        self._marks: deque[tuple[float, int]] = deque()
        self.total = 0

    def add(self, t: float, n: int) -> None:
        self.total += n
        self._marks.append((t, self.total))
        while len(self._marks) > 2 and t - self._marks[0][0] > self.window_s:
            self._marks.popleft()

    def rate(self, t: float) -> float:
        if len(self._marks) < 2 or t - self._marks[-1][0] > self.window_s:
            return 0.0
        (t0, n0), (t1, n1) = self._marks[0], self._marks[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


class SchedCollector:
    """prometheus_client custom collector over a `() -> SchedStats` callable (register it yourself)."""

    def __init__(self, snapshot: Callable[[], SchedStats], prefix: str = "fak_sched") -> None:
        self._snapshot = snapshot
        self._p = prefix

    def describe(self) -> list[object]:
        return []  # unchecked collector: metrics are produced on collect()

    def collect(self) -> Iterator[object]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s, p = self._snapshot(), self._p

        def gauge(name: str, doc: str, v: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{p}_{name}", doc, value=v)

        def counter(name: str, doc: str, v: float) -> CounterMetricFamily:
            return CounterMetricFamily(f"{p}_{name}", doc, value=v)

        yield gauge("running", "Lanes prefilling or decoding", s.running)
        yield gauge("waiting", "Admitted lanes not yet running", s.waiting)
        yield gauge("preempted", "Lanes preempted and awaiting readmission", s.preempted)
        yield gauge("tokens_per_second", "Generated tokens per second (sliding window)", s.tokens_per_s)
        yield gauge("kv_blocks_used", "KV blocks in use (including prefix-cache blocks)", s.used_blocks)
        yield gauge("kv_blocks_max", "KV block budget (0 = growable)", s.max_blocks or 0)
        yield gauge("kv_blocks_cached", "KV blocks held by the prefix cache", s.cached_blocks)
        yield gauge("max_running_observed", "Peak number of running lanes", s.max_running_observed)
        yield counter("steps", "Batched decode steps", s.steps)
        yield counter("generated_tokens", "Tokens generated", s.tokens_generated)
        yield counter("prefill_tokens", "Prompt tokens prefilled (excluding prefix hits)", s.prefill_tokens)
        yield counter("admitted", "Requests admitted", s.admitted)
        fin = CounterMetricFamily(f"{p}_finished", "Requests finished, by reason", labels=["reason"])
        for reason, n in sorted(s.finished.items()):
            fin.add_metric([reason], n)
        yield fin
        yield counter("prefix_queries", "Prefix-cache lookups", s.prefix_queries)
        yield counter("prefix_hits", "Prefix-cache lookups that mapped at least one block", s.prefix_hits)
        yield counter("prefix_hit_tokens", "Prompt tokens served from the prefix cache", s.prefix_hit_tokens)
        yield counter("prefix_tainted_refused", "Offers of tainted KV spans the prefix cache refused",
                      s.prefix_tainted_refused)
        root = p.removesuffix("_sched")  # fak_kv_disk_*: the prefix cache's disk tier
        for name, doc, v, kind in (
                ("hits", "KV blocks loaded from the disk cache instead of prefilled", s.kv_disk_hits, counter),
                ("read_bytes", "Bytes read from the KV disk cache", s.kv_disk_bytes_read, counter),
                ("written_bytes", "Bytes written to the KV disk cache", s.kv_disk_bytes_written, counter),
                ("evictions", "KV disk cache files evicted (LRU, byte bound)", s.kv_disk_evictions, counter),
                ("refused", "KV disk cache files refused (corrupt, another model or scope)", s.kv_disk_refused,
                 counter),
                ("files", "KV blocks held on disk", s.kv_disk_files, gauge),
                ("bytes", "Bytes the KV disk cache holds", s.kv_disk_bytes, gauge),
                ("enabled", "1 while KV blocks are persisted to disk", s.kv_disk_enabled, gauge)):
            yield CounterMetricFamily(f"{root}_kv_disk_{name}", doc, value=v) if kind is counter else \
                GaugeMetricFamily(f"{root}_kv_disk_{name}", doc, value=v)
        for name, doc, v in (("drafted", "Draft tokens verified (speculative decoding)", s.spec_drafted),
                             ("accepted", "Draft tokens the model emitted as drafted", s.spec_accepted),
                             ("lane_steps", "Lane-steps that carried a draft", s.spec_lane_steps),
                             ("emitted", "Tokens emitted by lane-steps that carried a draft", s.spec_emitted)):
            yield CounterMetricFamily(f"{root}_spec_{name}", doc, value=v)
        yield GaugeMetricFamily(f"{root}_spec_acceptance", "Accepted / drafted tokens since start (0 before any)",
                                value=s.spec_accepted / s.spec_drafted if s.spec_drafted else 0.0)
        yield GaugeMetricFamily(f"{root}_spec_tokens_per_step", "Tokens a drafting lane-step emitted, on average",
                                value=s.spec_emitted / s.spec_lane_steps if s.spec_lane_steps else 0.0)
        pre = CounterMetricFamily(f"{p}_preempt", "Preemptions, by mode", labels=["mode"])
        pre.add_metric(["swap"], s.preemptions_swap)
        pre.add_metric(["recompute"], s.preemptions_recompute)
        yield pre
        yield counter("preempt_swap_out_bytes", "KV bytes swapped out to host", s.swap_bytes_out)
        yield counter("preempt_swap_in_bytes", "KV bytes swapped back in", s.swap_bytes_in)
        yield counter("preempt_readmitted", "Preempted lanes readmitted", s.readmitted)
        if s.last_victim is not None:
            v = s.last_victim
            last = GaugeMetricFamily(
                f"{p}_preempt_last_victim_cost", "Cost of the last victim (-1 when its rule has none)",
                labels=["rule", "mode"],
            )
            last.add_metric([v.rule, v.mode], -1.0 if v.cost is None else v.cost)
            yield last
