"""PDCluster: one prefill worker, N decode workers and a router in one process (threads), behind
NativeScheduler's admit/Handle API, so a server can use it in place of a scheduler.

A request: validated and tokenized on the caller's thread; routed (longest resident prefix, else least
loaded, engine/sched/router.py); on the prefill worker's thread the chosen decode worker reserves the
leading blocks it holds, the prefill worker computes the prompt (its own prefix hits aside) and sends
only the remaining blocks as one frame over that worker's link (inproc, shm or tcp); the decode worker's
receiver imports it and admits the lane straight into decoding (NativeScheduler.admit_prefilled). The
caller's Handle streams from the decode worker's scheduler. A prefill or transfer failure finishes the
request with an error, never hangs it.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from engine.errors import EngineError
from engine.pd.metrics import PDCollector
from engine.pd.workers import DecodeWorker, Delivery, PrefillWorker
from engine.sched.api import Topology
from engine.sched.lane import FinishReason, Handle, LaneResult, LaneState, Request, now
from engine.sched.prefix_cache import chain_hashes, default_cache_bytes, shareable_blocks
from engine.sched.router import Route, Router
from engine.sched.stats import SchedStats, merge_stats

T = TypeVar("T")

TRANSPORTS = ("inproc", "shm", "tcp")


def _link(kind: str, shm_bytes: int) -> tuple[Any, Any]:
    from engine.wire import ShmReceiver, ShmSender, TcpReceiver, TcpSender, inproc_pair

    if kind == "inproc":
        return inproc_pair()
    if kind == "shm":
        rx = ShmReceiver(shm_bytes)
        return ShmSender(rx.name), rx
    if kind == "tcp":
        rx = TcpReceiver()
        return TcpSender(*rx.address), rx
    raise EngineError(f"unknown transport {kind!r} (known: {', '.join(TRANSPORTS)})")


@dataclass(eq=False)
class _Job:
    request: Request
    ids: list[int]
    handle: Handle
    route: Route
    admitted_at: float
    cancelled: bool = False
    admitted: bool = False


class PDCluster:
    def __init__(self, model: Any, *, decode_workers: int = 2, transport: str = "inproc", tokenizer: Any = None,
                 eos_ids: tuple[int, ...] | None = None, block_tokens: int = 16, prefill_chunk: int = 64,
                 prefill_budget: int = 256, kv_blocks: int | None = None, max_running: int = 0,
                 prefix_cache_bytes: int | None = None, batch_prefill: bool = True, blas_chunks: bool = True,
                 balance_abs: int = 4, balance_rel: float = 1.5, shm_bytes: int = 64 << 20,
                 key: bytes = b"") -> None:
        if decode_workers < 1:
            raise EngineError(f"decode_workers must be >= 1, got {decode_workers}")
        self.block_tokens = block_tokens
        self.tokenizer = tokenizer
        if prefix_cache_bytes is None:  # the machine's default share, split between the prefill and decode pools
            prefix_cache_bytes = default_cache_bytes() // (1 + decode_workers)
        self.on_finish: Callable[[LaneResult], None] | None = None  # every finished request (metrics)
        self.prefill = PrefillWorker(model, block_tokens=block_tokens, prefill_chunk=prefill_chunk,
                                     batch_prefill=batch_prefill, blas_chunks=blas_chunks,
                                     prefix_cache_bytes=prefix_cache_bytes, key=key)
        names = [f"decode-{i}" for i in range(decode_workers)]
        self.router = Router(names, balance_abs=balance_abs, balance_rel=balance_rel)
        self._lock = threading.Lock()
        self._load = dict.fromkeys(names, 0)  # requests routed to a worker and not finished yet
        self._senders: dict[str, Any] = {}
        self.decoders: dict[str, DecodeWorker] = {}
        self.moved: dict[str, dict[str, int]] = {w: {"requests": 0, "blocks": 0, "bytes": 0, "skipped_blocks": 0}
                                                 for w in names}
        self._seq = itertools.count()
        self._closed = False
        for name in names:
            tx, rx = _link(transport, shm_bytes)
            w = DecodeWorker(model, name, receiver=rx, key=key,
                             listener=lambda kind, hs, name=name: self.router.publish(name, kind, hs),
                             tokenizer=tokenizer, eos_ids=eos_ids, block_tokens=block_tokens,
                             prefill_chunk=prefill_chunk, prefill_budget=prefill_budget, kv_blocks=kv_blocks,
                             max_running=max_running, prefix_cache_bytes=prefix_cache_bytes,
                             batch_prefill=batch_prefill, blas_chunks=blas_chunks)
            w.sched.on_finish = lambda result, name=name: self._finished(name, result)
            self._senders[name], self.decoders[name] = tx, w

    # ------------------------------------------------------------------ caller side
    def admit(self, request: Request) -> Handle:
        """Queue a request and return its handle (streams from the decode worker it lands on)."""
        if self._closed:
            raise EngineError("cluster is closed: admit() after close()")
        first = self._first()
        ids = first.sched._validate(request)
        if request.grammar is not None:
            first.sched.grammar_compiler()  # a grammar needs a tokenizer: say so now, not after the prefill
        seq = next(self._seq)
        handle = Handle(request, request.request_id or f"pd-{seq}", self._cancel_early)
        hashes = chain_hashes(ids, self.block_tokens, shareable_blocks(ids, self.block_tokens), request.scope)
        with self._lock:
            route = self.router.route(hashes, self._load)
            self._load[route.worker] += 1
        job = _Job(request, ids, handle, route, now())
        handle._job = job  # type: ignore[attr-defined]
        try:
            self.prefill.submit(lambda: self._run(job))
        except EngineError as e:
            self._fail(job, FinishReason.ERROR, str(e))
        return handle

    def loads(self) -> dict[str, int]:
        with self._lock:
            return dict(self._load)

    def _first(self) -> DecodeWorker:
        return next(iter(self.decoders.values()))

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run fn() on a decode worker's scheduler thread (the gateway's embeddings use its copy of the model)."""
        return self._first().sched.call(fn)

    def grammar_compiler(self) -> Any:
        return self._first().sched.grammar_compiler()

    def warm_grammar(self) -> None:
        self._first().sched.warm_grammar()

    def stats(self) -> SchedStats:
        """The decode workers' scheduler snapshots summed (what the serve panels and /metrics read)."""
        return merge_stats([w.sched.stats() for w in self.decoders.values()], self.block_tokens)

    def topology(self) -> Topology:
        return Topology("pd", pd=self.pd_stats)

    def collectors(self) -> list[object]:
        """The fak_pd_* families over pd_stats()."""
        return [PDCollector(self.pd_stats)]

    def pd_stats(self) -> dict[str, Any]:
        """Per-worker figures (role, requests, imports, bytes moved, blocks skipped) and the router's counts."""
        out: dict[str, Any] = {"prefill": {"role": "prefill", **self.prefill.stats}, "router": dict(self.router.counts)}
        for name, w in self.decoders.items():
            s = w.sched.stats()
            out[name] = {"role": "decode", **w.stats, **self.moved[name], "transfer_s": w.transfer_s,
                         "prefill_tokens": s.prefill_tokens, "imported": s.imported}
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.prefill.close()  # runs what is queued first
        for name, w in self.decoders.items():
            w.close()
            self._senders[name].close()

    def __enter__(self) -> PDCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ prefill thread
    def _run(self, job: _Job) -> None:
        if job.cancelled:
            self._fail(job, FinishReason.CANCELLED)
            return
        name = job.route.worker
        w = self.decoders[name]
        held: list[int] = []
        try:
            held = w.reserve(job.ids, job.request.scope)
            res = self.prefill.prefill(job.ids, job.request.kv_descriptor, len(held))
            d = Delivery(job.request, job.ids, held, res.logits, job.handle)
            d.done.add_done_callback(lambda f: self._delivered(job, f))
            m = self.moved[name]  # counted before the send: the lane may finish before send() returns
            m["requests"] += 1
            m["blocks"] += res.blocks
            m["bytes"] += len(memoryview(res.frame).cast("B"))
            m["skipped_blocks"] += res.skip
            w.expect(d)
            held = []  # the delivery owns them now (released by the decode worker if the import fails)
            self._senders[name].send(res.frame, 30.0)
        except Exception as e:
            w.release(held)
            self._fail(job, FinishReason.ERROR, f"prefill/transfer failed: {type(e).__name__}: {e}")

    # ------------------------------------------------------------------ completion
    def _delivered(self, job: _Job, fut: Future[Handle]) -> None:
        exc = fut.exception()
        if exc is not None:
            self._fail(job, FinishReason.ERROR, f"KV import failed: {type(exc).__name__}: {exc}")
            return
        job.admitted = True
        if job.cancelled:
            job.handle.cancel()  # now bound to the decode worker's scheduler

    def _cancel_early(self, handle: Handle) -> None:
        job: _Job = handle._job  # type: ignore[attr-defined]
        job.cancelled = True

    def _finished(self, name: str, result: LaneResult | None = None) -> None:
        with self._lock:
            self._load[name] -= 1
        if result is not None:
            self._notify(result)

    def _notify(self, result: LaneResult) -> None:
        if self.on_finish is not None:
            try:
                self.on_finish(result)
            except Exception:  # an observer (metrics) must not fail the request
                pass

    def _fail(self, job: _Job, reason: FinishReason, error: str | None = None) -> None:
        if job.handle.done:
            return
        self._finished(job.route.worker)
        t = now()
        job.handle.state = LaneState.FINISHED
        result = LaneResult(
            request_id=job.handle.request_id, token_ids=[], text=None, finish_reason=reason, error=error,
            prompt_tokens=len(job.ids), prefix_hit_tokens=0, preemptions=0, ttft_s=None,
            latency_s=t - job.admitted_at)
        job.handle._set_result(result, "")
        self._notify(result)
