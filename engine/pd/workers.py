"""P/D workers: a PrefillWorker computes prompt KV and ships the new blocks as a frame; a DecodeWorker imports
frames into its scheduler's pool and decodes (NativeScheduler.admit_prefilled: nothing re-prefilled there).

Numerics: the prefill worker chunks a prompt exactly as NativeScheduler does (chunks end on absolute
multiples of prefill_chunk; a full chunk through Session.prefill (BLAS), the others through the row-stable
forward_batch; prefix hits whole chunks), so the logits it hands over, and the KV it ships, are those a
local prefill computes: a greedy lane decodes the same tokens on either topology.

Residency: before a prompt is prefilled, the chosen decode worker reserves the leading prompt blocks its
prefix cache holds (by chain hash, within the request's scope: one reference each, so they cannot be
evicted before the frame arrives); only the blocks after those are moved. Each worker owns one thread
(the decode worker: its scheduler's loop and a receiver): pools are only touched there.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from engine.errors import EngineError
from engine.model.kv import KVExhausted
from engine.sched.lane import Handle, Request
from engine.sched.preemption import attach
from engine.sched.prefix_cache import PrefixCache, cache_blocks, chain_hashes, shareable_blocks
from engine.sched.scheduler import NativeScheduler
from engine.sched.trust import KVDescriptor
from engine.wire.blocks import export_blocks, import_blocks
from engine.wire.frame import Descriptor, FrameError, KVLayout, decode_frame
from engine.wire.transport import TransportClosed, TransportTimeout

T = TypeVar("T")


def frame_descriptor(d: KVDescriptor) -> Descriptor:
    return Descriptor(d.scope, d.taint, d.verdict)


def prompt_block_hashes(ids: list[int], block_tokens: int, scope: str) -> list[int]:
    """Chain hashes of every prompt block, the last one possibly partial (what a frame carries)."""
    return chain_hashes(ids, block_tokens, -(-len(ids) // block_tokens), scope)


@dataclass
class PrefillResult:
    frame: bytearray | memoryview  # the blocks after `skip`, as a KV frame
    logits: np.ndarray  # [vocab] of the last prompt position
    skip: int  # leading blocks not carried (the decode worker holds them)
    blocks: int  # blocks carried
    computed_tokens: int  # prompt tokens this worker prefilled (its own prefix hits excluded)


class _Executor:
    """One thread running submitted functions in order (the thread that owns a worker's pool)."""

    def __init__(self, name: str) -> None:
        self._q: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        fut: Future[T] = Future()
        with self._cond:
            if self._closed:
                raise EngineError(f"{self._thread.name} is closed")
            self._q.append((fn, fut))
            self._cond.notify()
        return fut

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._q and not self._closed:
                    self._cond.wait()
                if not self._q:
                    return
                fn, fut = self._q.popleft()
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as e:
                    fut.set_exception(e)

    def close(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)


class PrefillWorker:
    """Prompt prefill on its own growable pool with its own prefix cache; `prefill` runs on its thread."""

    def __init__(self, model: Any, *, block_tokens: int = 16, prefill_chunk: int = 64, batch_prefill: bool = True,
                 blas_chunks: bool = True, prefix_cache: bool = True, prefix_cache_bytes: int | None = None,
                 key: bytes = b"", thread: bool = True) -> None:
        from engine.model.session import Session, forward_batch

        self._Session, self._forward_batch = Session, forward_batch
        self.model = model
        self.pool = model.new_pool(None, block_tokens)
        self.prefix = PrefixCache(self.pool) if prefix_cache else None
        self.prefix_cache_blocks = cache_blocks(self.pool, prefix_cache_bytes)
        self.chunk = prefill_chunk
        self.batch_prefill = batch_prefill
        self.blas_chunks = batch_prefill and blas_chunks and prefill_chunk % block_tokens == 0  # as NativeScheduler
        self.hit_align = prefill_chunk // block_tokens if self.blas_chunks else 1
        self.key = key
        self.stats: dict[str, int] = dict.fromkeys(("requests", "prefill_tokens", "hit_tokens", "blocks_out",
                                                    "bytes_out"), 0)
        self._exec = _Executor("fak-prefill") if thread else None

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Run fn() on the worker's thread (or now, without one)."""
        if self._exec is not None:
            return self._exec.submit(fn)
        fut: Future[T] = Future()
        try:
            fut.set_result(fn())
        except BaseException as e:
            fut.set_exception(e)
        return fut

    def prefill(self, ids: list[int], desc: KVDescriptor, skip: int = 0) -> PrefillResult:
        """Prefill `ids` (own prefix hits mapped, whole chunks) and export the blocks from `skip` on."""
        bt, n = self.pool.block_tokens, len(ids)
        if not 0 <= skip <= shareable_blocks(ids, bt):
            raise EngineError(f"prefill: cannot skip {skip} blocks of a {n}-token prompt")
        s = self._Session(self.model, pool=self.pool)
        try:
            hit = 0
            if self.prefix is not None:
                blocks = self.prefix.match(ids, n - 1, self.hit_align, desc.scope)
                if blocks:
                    hit = len(blocks) * bt
                    attach(s, blocks, hit)
                    s.tokens = list(ids[:hit])
            pos, logits = hit, None
            while pos < n:
                end = min(n, (pos // self.chunk + 1) * self.chunk)
                part = ids[pos:end]
                if not self.batch_prefill or (self.blas_chunks and len(part) == self.chunk):
                    logits = s.prefill(part)
                else:
                    logits = self._forward_batch([s], [part])[0]
                pos = end
            assert logits is not None
            if self.prefix is not None:
                self.prefix.insert(ids, s.kv.blocks, n // bt, desc)
            nb = len(s.kv.blocks)
            hashes = prompt_block_hashes(ids, bt, desc.scope)
            frame = export_blocks(self.pool, s.kv.blocks[skip:], hashes[skip:], [i * bt for i in range(skip, nb)],
                                  frame_descriptor(desc), self.model.identity, last_fill=n - (nb - 1) * bt,
                                  key=self.key)
        finally:
            s.free()
        if self.prefix is not None:
            self.prefix.trim(self.prefix_cache_blocks)
        st = self.stats
        st["requests"] += 1
        st["prefill_tokens"] += n - hit
        st["hit_tokens"] += hit
        st["blocks_out"] += nb - skip
        st["bytes_out"] += len(frame)
        return PrefillResult(frame, np.array(logits, dtype=np.float32), skip, nb - skip, n - hit)

    def close(self) -> None:
        if self._exec is not None:
            self._exec.close()
        if self.prefix is not None:
            self.prefix.clear()


@dataclass
class Delivery:
    """What travels beside a frame to a decode worker (in order with the frames of its link)."""

    request: Request
    ids: list[int]
    held: list[int]  # the reserved leading blocks (this worker's pool, one reference each)
    logits: np.ndarray
    handle: Handle | None = None
    done: Future[Handle] = field(default_factory=Future)  # the admitted handle, or the import's error


class DecodeWorker:
    """A NativeScheduler fed with prefilled lanes: frames from a transport receiver are imported into its pool
    (on its loop thread) and admitted via admit_prefilled. `listener(kind, hashes)` gets its prefix cache's
    add/evict events (a router's residency view)."""

    def __init__(self, model: Any, name: str = "decode-0", *, receiver: Any = None,
                 listener: Callable[[str, list[int]], None] | None = None, key: bytes = b"",
                 **sched_kwargs: Any) -> None:
        self.name = name
        self.model = model
        self.sched = NativeScheduler(model, **sched_kwargs)
        self.block_tokens = self.sched.pool.block_tokens
        self.layout = KVLayout.of(self.sched.pool)
        self.key = key
        if listener is not None and self.sched.prefix is not None:
            self.sched.prefix.listener = listener
        self.stats: dict[str, int] = dict.fromkeys(("imports", "refused", "blocks_in", "bytes_in", "held_blocks",
                                                   "import_waits"), 0)
        self.transfer_s = 0.0
        self._pending: deque[Delivery] = deque()
        self._pending_lock = threading.Lock()
        self._receiver = receiver
        self._closing = False
        self._rx_thread: threading.Thread | None = None
        if receiver is not None:
            self._rx_thread = threading.Thread(target=self._receive, name=f"fak-{name}-rx", daemon=True)
            self._rx_thread.start()

    # -- residency (any thread; runs on the loop thread)
    def held(self, ids: list[int], scope: str = "") -> int:
        """How many leading blocks of this prompt the worker holds now (by chain hash, in `scope`)."""
        prefix = self.sched.prefix
        if prefix is None:
            return 0
        lim = shareable_blocks(ids, self.block_tokens) * self.block_tokens
        return self.sched.call(lambda: prefix.peek(ids, lim, 1, scope)[0]).result()

    def reserve(self, ids: list[int], scope: str = "") -> list[int]:
        """The leading prompt blocks this worker holds, with one reference each taken for the caller (so
        they survive until the frame with the rest arrives): pass them to deliver(), or to release()."""
        prefix = self.sched.prefix
        if prefix is None:
            return []
        lim = shareable_blocks(ids, self.block_tokens) * self.block_tokens
        blocks = self.sched.call(lambda: prefix.match(ids, lim, 1, scope)).result()
        self.stats["held_blocks"] += len(blocks)
        return blocks

    def release(self, blocks: list[int]) -> None:
        if blocks:
            pool = self.sched.pool
            self.sched.call(lambda: [pool.release(b) for b in blocks]).result()

    # -- admission
    def expect(self, delivery: Delivery) -> None:
        """Announce the next frame on this worker's link (the sender calls it right before sending)."""
        with self._pending_lock:
            self._pending.append(delivery)

    def deliver(self, delivery: Delivery, frame: Any, wait: float = 60.0) -> Handle:
        """Import `frame` (the prompt's blocks after delivery.held) and admit the lane, on the loop thread; on
        any error the held blocks are released and nothing stays imported. A fixed pool without room for the
        frame is retried (running lanes finish and free blocks) for up to `wait` seconds."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + wait
        while True:
            try:
                handle = self.sched.call(lambda: self._import_admit(delivery, frame)).result()
                break
            except KVExhausted:
                if time.monotonic() < deadline:
                    self.stats["import_waits"] += 1
                    time.sleep(0.005)
                    continue
                self.release(delivery.held)
                self.stats["refused"] += 1
                raise
            except BaseException:
                self.stats["refused"] += 1
                raise
        self.transfer_s += time.perf_counter() - t0
        return handle

    def _import_admit(self, d: Delivery, frame: Any) -> Handle:
        sched, bt = self.sched, self.block_tokens
        try:
            f = decode_frame(frame, self.model.identity, self.layout, self.key)
            desc = d.request.kv_descriptor
            if f.descriptor.scope != desc.scope or f.descriptor.taint != desc.taint:
                raise FrameError(f"KV frame descriptor (scope {f.descriptor.scope!r}, taint {f.descriptor.taint}) "
                                 f"does not match the request's (scope {desc.scope!r}, taint {desc.taint})")
            want = prompt_block_hashes(d.ids, bt, desc.scope)[len(d.held):]
            if f.n_blocks != len(want) or f.hashes.tolist() != want or \
                    f.positions.tolist() != [i * bt for i in range(len(d.held), len(d.held) + len(want))]:
                raise FrameError(f"KV frame carries blocks {f.positions[:4].tolist()}... that are not this "
                                 f"prompt's blocks after the {len(d.held)} held ones")
            short = f.n_blocks - sched.pool.num_free
            if not sched.pool.growable and short > 0 and sched.prefix is not None:
                sched.prefix.evict(short)
            new = import_blocks(sched.pool, frame, self.model.identity, self.key)
        except KVExhausted:
            raise  # no room yet: deliver() retries, the held blocks stay reserved
        except EngineError:
            for b in d.held:
                sched.pool.release(b)
            raise
        blocks = d.held + new
        try:
            handle = sched.admit_prefilled(d.request, blocks, len(d.ids), d.logits, handle=d.handle)
        except EngineError:
            for b in blocks:
                sched.pool.release(b)
            raise
        self.stats["imports"] += 1
        self.stats["blocks_in"] += len(new)
        self.stats["bytes_in"] += len(memoryview(frame).cast("B"))
        return handle

    def _receive(self) -> None:
        rx = self._receiver
        while True:
            try:
                frame = rx.recv(timeout=0.2)
            except TransportTimeout:
                if self._closing:
                    break
                continue
            except TransportClosed:
                break
            with self._pending_lock:
                d = self._pending.popleft() if self._pending else None
            if d is None:  # a frame nobody announced: nothing to admit it for
                self.stats["refused"] += 1
                continue
            try:
                d.done.set_result(self.deliver(d, frame))  # the frame's view is valid until the next recv
            except BaseException as e:
                d.done.set_exception(e)
        with self._pending_lock:
            left, self._pending = list(self._pending), deque()
        for d in left:
            if not d.done.done():
                d.done.set_exception(EngineError(f"{self.name}: link closed before the frame arrived"))

    def close(self) -> None:
        self._closing = True
        if self._rx_thread is not None:
            self._rx_thread.join(5)
        if self._receiver is not None:
            self._receiver.close()
        self.sched.close()
