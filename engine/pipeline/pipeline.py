"""Pipeline parallelism behind the scheduler's model-call seam: PipelineModel, StagedPool, Pipeline.

The scheduler is unchanged. It runs a PipelineModel, whose forward embeds the ids here, sends the hidden
rows through the stages (each a band of layers with its own KV, engine/pipeline/stage.py) and applies the
final norm and LM head here, so the logits, the sampling and every lane's state stay with the scheduler.
Its pool is a StagedPool: the scheduler's allocator (block ids, refcounts, prefix cache, budget) with no
tensors of its own; copy-on-write, swap-out and swap-in act on every stage's blocks of those ids.

Several forwards in flight: `run` is thread-safe, and a PipelinedScheduler (engine/pipeline/scheduler.py)
runs one scheduler per group of lanes over one pipeline, so while stage 2 runs group A's step, stage 1
runs group B's. (A forward can also be cut into `micro_batches` pieces sent back to back; for decode that
re-reads every stage's weights per piece, so it is off by default.) Each row's numbers do not depend on
its batch mates (the decode kernels are row-stable). A decode step moves lanes x hidden x 4 bytes per link plus a header
of a few ints per lane: block tables travel as deltas (engine/pipeline/stage.py), never the history.

Stages run in this process (threads, `transport="inproc"`) or in `fak worker --role stage` processes
(engine/pipeline/stage_node.py) over shared-memory rings (`shm`, one host) or TCP channels (`tcp`).
"""

from __future__ import annotations

import itertools
import json
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import numpy as np

from engine.errors import EngineError
from engine.model.forward import LaneInput, Model
from engine.model.kv import BlockPool, KVLost
from engine.model.scratch import Scratch
from engine.pipeline.partition import PartitionPlan
from engine.pipeline.stage import Stage, serve
from engine.wire.channel import Channel, parse_address
from engine.wire.link import ChannelLink, QueueLink, RingReceiver, RingSender
from engine.wire.node import PROTOCOL
from engine.wire.secure import LinkKey
from engine.wire.transport import TransportClosed, TransportTimeout

T = TypeVar("T")

TRANSPORTS = ("inproc", "shm", "tcp")


class LocalStage:
    """A stage in this process: the Stage object and the thread running its loop."""

    def __init__(self, stage: Stage) -> None:
        self.stage = stage
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    @property
    def band(self) -> tuple[int, int]:
        return self.stage.lo, self.stage.hi

    def start(self, inbound: Any, outbound: Any) -> None:
        self.thread = threading.Thread(target=serve, args=(self.stage, inbound, outbound, self.stop),
                                       name=f"fak-stage-{self.stage.lo}-{self.stage.hi}", daemon=True)
        self.thread.start()

    def read(self, pid: int, blocks: list[int]) -> bytes:
        return self.stage.read(pid, blocks)

    def write(self, pid: int, blocks: list[int], data: bytes) -> None:
        self.stage.write(pid, blocks, data)

    def copy(self, pid: int, src: int, dst: int) -> None:
        self.stage.copy(pid, src, dst)

    def reset_pool(self, pid: int, num_blocks: int | None, block_tokens: int, gen: int = 0) -> int:
        return self.stage.reset_pool(pid, num_blocks, block_tokens, gen)

    def info(self, fresh: bool = True) -> dict[str, Any]:
        return self.stage.info()

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(5)


class RemoteStage:
    """A `fak worker --role stage` process, driven over its control channel (a reader thread routes the
    replies and keeps the latest heartbeat; a stage that goes away fails the calls waiting on it)."""

    def __init__(self, address: str, timeout: float = 30.0, link: LinkKey | None = None) -> None:
        host, port = parse_address(address, "stage worker")
        self.address = address
        self.ch = Channel.connect(host, port, timeout=timeout, peer=f"stage {address}", key=link)
        self.ch.send({"op": "hello", "as": "head", "protocol": PROTOCOL})
        self.hello, _ = self.ch.recv(timeout)
        if self.hello.get("error"):
            self.ch.close()
            raise EngineError(f"stage worker {address}: {self.hello['error']}")
        if self.hello.get("role") != "stage":
            self.ch.close()
            raise EngineError(f"{address} is a {self.hello.get('role')} worker, not a stage worker")
        self.layers = tuple(self.hello["layers"])
        self._ids = itertools.count()
        self._waiting: dict[int, Future[tuple[dict[str, Any], Any]]] = {}
        self._lock = threading.Lock()
        self.beat: dict[str, Any] = {}
        self.up = True
        threading.Thread(target=self._read, name=f"fak-stage-{address}", daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                header, blobs = self.ch.recv()
                if header.get("op") == "stats":
                    self.beat = header
                    continue
                with self._lock:
                    fut = self._waiting.pop(int(header.get("id", -1)), None)
                if fut is not None:
                    fut.set_result((header, bytes(blobs[0]) if blobs else None))
        except Exception as e:
            self.up = False
            with self._lock:
                waiting, self._waiting = list(self._waiting.values()), {}
            for fut in waiting:
                fut.set_exception(EngineError(f"stage worker {self.address} went away: {e}"))

    def call(self, msg: dict[str, Any], blob: Any = None, timeout: float = 120.0) -> tuple[dict[str, Any], Any]:
        fut: Future[tuple[dict[str, Any], Any]] = Future()
        with self._lock:
            rid = next(self._ids)
            self._waiting[rid] = fut
        try:
            if blob is None:
                self.ch.send({**msg, "id": rid})
            else:
                self.ch.send({**msg, "id": rid}, blob)
            header, data = fut.result(timeout)
        except Exception as e:
            with self._lock:
                self._waiting.pop(rid, None)
            raise EngineError(f"stage {self.address}: {msg['op']} failed: {e}") from None
        if header.get("error"):
            raise EngineError(f"stage {self.address}: {msg['op']}: {header['error']}")
        return header, data

    @property
    def band(self) -> tuple[int, int]:
        return int(self.layers[0]), int(self.layers[1])

    def read(self, pid: int, blocks: list[int]) -> bytes:
        return self.call({"op": "read", "pool": pid, "blocks": blocks})[1] or b""

    def write(self, pid: int, blocks: list[int], data: bytes) -> None:
        self.call({"op": "write", "pool": pid, "blocks": blocks}, data)

    def copy(self, pid: int, src: int, dst: int) -> None:
        self.call({"op": "copy", "pool": pid, "src": src, "dst": dst})

    def reset_pool(self, pid: int, num_blocks: int | None, block_tokens: int, gen: int = 0) -> int:
        reply = self.call({"op": "pool", "pool": pid, "num_blocks": num_blocks, "block_tokens": block_tokens,
                           "gen": gen})[0]
        return int(reply["block_bytes"])

    def info(self, fresh: bool = True) -> dict[str, Any]:
        """This stage's figures: asked now, or (fresh=False, for a metrics scrape) its last heartbeat's."""
        if not fresh and self.beat.get("info"):
            return dict(self.beat["info"])
        if not self.up:
            return {"layers": list(self.layers), "up": False}
        return dict(self.call({"op": "info"})[0].get("info", {}))

    def close(self) -> None:
        self.ch.close()


class Pipeline:
    """The head's driver: hidden rows through the stages, in micro-batches, and the stages' control."""

    def __init__(self, model: Model, stages: list[Any], outbound: Any, inbound: Any, *, micro_batches: int = 0,
                 transport: str = "inproc", timeout: float = 600.0, head_last: bool = True) -> None:
        self.model, self.stages, self.out, self.back = model, stages, outbound, inbound
        self.head_last = head_last  # the last stage applies the norm and the LM head (returns logits)
        self.micro_batches = micro_batches or 1  # splitting one forward re-reads every weight per piece
        self.transport, self.timeout = transport, timeout
        self._keys = itertools.count()
        self._sent: dict[int, list[int]] = {}  # block table last sent per lane key (every stage saw the same)
        self._drops: list[int] = []
        self._seq = itertools.count()
        self._pool_ids = itertools.count()
        self._send_lock = threading.Lock()
        self._waiting: dict[int, queue.Queue[tuple[dict[str, Any], Any]]] = {}
        self._reader_error = ""
        self._closed = False
        self.last: dict[str, int] = {}
        self.owned: list[Any] = []
        self.stats: dict[str, float] = {"forwards": 0, "messages": 0, "wall_s": 0.0, "rows": 0, "bytes": 0,
                                        "header_bytes": 0, "decode_forwards": 0, "decode_bytes": 0,
                                        "decode_header_bytes": 0, "decode_lanes": 0, "in_flight_max": 0,
                                        "return_bytes": 0}
        self.generation = 0  # bumped when a replaced stage makes every pool's KV void
        self.pools: weakref.WeakSet[Any] = weakref.WeakSet()
        self.rejoin: Callable[[int, str], str] | None = None
        self.ring_bytes, self.connect_timeout = 256 << 20, 30.0
        self.link: LinkKey | None = None  # the cluster key the stage links are handshaken with
        self._recover_lock = threading.Lock()
        threading.Thread(target=self._collect, args=(inbound, 0), name="fak-pipeline-results", daemon=True).start()

    def _key(self, kv: Any) -> int:
        key = getattr(kv, "_pipe_key", None)
        if key is None:
            key = next(self._keys)
            kv._pipe_key = key
            weakref.finalize(kv, self._drops.append, key)  # the stages forget it with the next message
        return int(key)

    def _lane(self, ln: LaneInput) -> list[Any]:
        key, blocks = self._key(ln.kv), list(ln.kv.blocks)
        sent = self._sent.get(key)
        if sent == blocks:
            op = None
        elif sent is not None and blocks[: len(sent)] == sent:
            op = ["+", blocks[len(sent):]]
        else:
            op = ["=", blocks]
        self._sent[key] = blocks
        return [key, ln.start, ln.n, op]

    def run(self, x: np.ndarray, lanes: list[LaneInput], decode: bool, pool: Any = None,
            finish: dict[str, bool] | None = None) -> np.ndarray:
        """One forward of `lanes` (all in `pool`, a StagedPool of this pipeline) through the stages.
        Thread-safe: several schedulers over one pipeline keep several forwards in flight, each stage working
        on whichever arrived first. Raises KVLost when a stage was replaced since `pool` was last used (or
        during this forward): the caller recomputes its lanes."""
        gen = self.generation
        if pool is not None and pool.generation != gen:
            pool.generation = gen
            raise KVLost("a pipeline stage restarted: this scheduler's KV is gone")
        pid = pool.pid if pool is not None else 0
        t0 = time.perf_counter()
        n = len(lanes)
        k = max(1, min(self.micro_batches, n))
        bounds = [round(i * n / k) for i in range(k + 1)]
        rows = np.cumsum([0] + [ln.n for ln in lanes])
        box: queue.Queue[tuple[dict[str, Any], Any]] = queue.Queue()
        sent_bytes = header_bytes = 0
        try:
            with self._send_lock:
                drops, self._drops = self._drops, []
                for key in drops:
                    self._sent.pop(key, None)
                seq = next(self._seq)
                self._waiting[seq] = box
                self.stats["in_flight_max"] = max(self.stats["in_flight_max"], len(self._waiting))
                for g in range(k):
                    a, b = bounds[g], bounds[g + 1]
                    hdr = {"op": "fwd", "seq": seq, "g": g, "gen": gen, "pool": pid, "decode": decode,
                           "drop": drops if g == 0 else [], "lanes": [self._lane(ln) for ln in lanes[a:b]]}
                    if finish is not None:
                        hdr["finish"] = finish
                    part = np.ascontiguousarray(x[rows[a] : rows[b]], dtype=np.float32)
                    self.out.send(hdr, part)
                    sent_bytes += part.nbytes
                    header_bytes += len(json.dumps(hdr, separators=(",", ":")))
        except TransportClosed as e:
            with self._send_lock:
                self._waiting.pop(seq, None)
            self._recover(gen, f"sending to the first stage failed ({e})")
        ys: list[np.ndarray | None] = [None] * k
        errors = []
        deadline = time.monotonic() + self.timeout
        try:
            for _ in range(k):
                while True:
                    try:
                        h, y = box.get(timeout=0.25)
                        break
                    except queue.Empty:
                        if self.generation != gen:  # another forward found a stage gone and replaced it
                            raise KVLost("a pipeline stage restarted during this forward") from None
                        gone = [s for s in self.stages if not getattr(s, "up", True)]
                        if gone or self._reader_error:
                            why = self._reader_error or f"stage worker {gone[0].address} went away"
                            self._recover(gen, why)
                        if time.monotonic() > deadline:
                            raise EngineError(f"pipeline: no answer from the last stage within {self.timeout} s") from None
                if h.get("error"):
                    errors.append(str(h["error"]))
                    continue
                ys[int(h["g"])] = y
        finally:
            with self._send_lock:
                self._waiting.pop(seq, None)
        if errors:
            raise EngineError(f"pipeline forward failed: {errors[0]}")
        with self._send_lock:
            st = self.stats
            st["forwards"] += 1
            st["messages"] += k
            st["wall_s"] += time.perf_counter() - t0
            st["rows"] += int(x.shape[0])
            st["bytes"] += sent_bytes
            st["header_bytes"] += header_bytes
            if decode and int(x.shape[0]) == n:  # one row per lane: a pure decode step
                st["decode_forwards"] += 1
                st["decode_bytes"] += sent_bytes
                st["decode_header_bytes"] += header_bytes
                st["decode_lanes"] += n
            back = sum(y.nbytes for y in ys if y is not None)
            st["return_bytes"] += back
            self.last = {"lanes": n, "rows": int(x.shape[0]), "bytes": sent_bytes, "header_bytes": header_bytes,
                         "micro_batches": k, "return_bytes": back}
        return np.concatenate(ys)  # type: ignore[arg-type]

    def _recover(self, gen: int, why: str) -> None:
        """A stage went away during a forward of generation `gen`: get it back (rejoin), renew every link,
        reset every pool on every stage, and raise KVLost, or fail with why when there is no way back."""
        with self._recover_lock:
            if self.generation != gen:  # already recovered by another forward
                raise KVLost("a pipeline stage restarted during this forward")
            if self.rejoin is None:
                raise EngineError(f"pipeline: {why}")
            try:
                for i, s in enumerate(self.stages):
                    if not getattr(s, "up", True):
                        address = self.rejoin(i, why)
                        self.stages[i] = RemoteStage(address, self.connect_timeout, self.link)
                for link in (self.out, self.back):
                    try:
                        link.close()
                    except Exception:
                        pass
                out, back = _wire(self.model, self.stages, self.transport, self.ring_bytes, self.connect_timeout,
                                  self.link)
                with self._send_lock:
                    self.generation += 1
                    self._sent.clear()
                    self._drops = []
                    self.out, self.back, self._reader_error = out, back, ""
                for p in list(self.pools):
                    p._sizes = [st.reset_pool(p.pid, p.budget, p.block_tokens, self.generation) for st in self.stages]
                self.stats["recoveries"] = self.stats.get("recoveries", 0) + 1
                threading.Thread(target=self._collect, args=(back, self.generation), name="fak-pipeline-results",
                                 daemon=True).start()
            except KVLost:
                raise
            except Exception as e:
                raise EngineError(f"pipeline: {why}; bringing the stage back failed: {e}") from None
            raise KVLost(f"pipeline stage replaced ({why})")

    def _collect(self, link: Any = None, gen: int = 0) -> None:
        """The results reader: every answer from the last stage to the forward waiting for it (by step)."""
        hidden, vocab = int(self.model.config.hidden), int(self.model.config.vocab_size)
        link = link if link is not None else self.back
        while not self._closed and gen == self.generation:
            try:
                h, blob = link.recv(0.5)
            except TransportTimeout:
                continue
            except Exception as e:  # the link is gone: every waiting forward fails (or recovers) now
                if not self._closed and gen == self.generation:
                    self._reader_error = f"the results link closed ({e})"
                return
            with self._send_lock:
                box = self._waiting.get(int(h.get("seq", -1)))
            if box is not None:  # else a step that failed earlier left answers behind: dropped
                width = hidden if not h.get("finish") or not h["finish"].get("head", True) else vocab
                y = None if h.get("error") else np.frombuffer(blob, dtype=np.float32).reshape(-1, width).copy()
                box.put((h, y))

    def new_pool_id(self) -> int:
        with self._send_lock:
            return next(self._pool_ids)

    def stage_stats(self, fresh: bool = True) -> list[dict[str, Any]]:
        """Per stage: layers, steps, rows, busy time, bytes; utilisation = busy / the pipeline's forward time."""
        wall = self.stats["wall_s"] or 1.0
        out = []
        for s in self.stages:
            info = s.info(fresh)
            info["utilisation"] = info.get("busy_s", 0.0) / wall
            info["bubble"] = max(0.0, 1.0 - info["utilisation"])
            out.append(info)
        return out

    def close(self) -> None:
        self._closed = True
        for s in self.stages:
            s.close()
        for link in (self.out, self.back):
            try:
                link.close()
            except Exception:
                pass
        for thing in self.owned:
            thing.close()


class StagedPool(BlockPool):
    """The scheduler's pool for a pipeline: allocator and refcounts here, K/V on the stages (pool `pid` there)."""

    def __init__(self, pipeline: Pipeline, config: Any, num_blocks: int | None, block_tokens: int) -> None:
        super().__init__(0, config.n_kv_heads, config.head_dim, num_blocks=num_blocks, block_tokens=block_tokens)
        self.pipeline = pipeline
        self.pid = pipeline.new_pool_id()
        self.budget = num_blocks
        self.generation = pipeline.generation
        self._sizes = [s.reset_pool(self.pid, num_blocks, block_tokens, pipeline.generation) for s in pipeline.stages]
        pipeline.pools.add(self)
        # what a KV frame must match (engine/wire/frame.py KVLayout): every layer, though none is stored here
        self.n_layers = int(config.n_layers)

    @property
    def block_bytes(self) -> int:
        return sum(self._sizes)

    def _on_stages(self, what: str, fn: Callable[[], T]) -> T:
        """fn(), which calls the stages. A stage that went away meanwhile (or a recovery another thread made)
        is the pipeline's recovery, as in a forward: the stage rejoins and KVLost is raised (the scheduler
        recomputes its lanes; a KV import is re-routed by the head), not this call's error."""
        gen = self.pipeline.generation
        try:
            return fn()
        except EngineError as e:
            if self.pipeline.generation == gen and all(getattr(s, "up", True) for s in self.pipeline.stages):
                raise  # every stage is there: the call itself failed
            self.pipeline._recover(gen, f"{what}: {e}")  # raises KVLost, or EngineError with no way back
            raise

    def read_blocks(self, blocks: list[int]) -> bytes:
        return self._on_stages("reading KV blocks", lambda: b"".join(s.read(self.pid, blocks)
                                                                     for s in self.pipeline.stages))

    def write_blocks(self, blocks: list[int], data: bytes) -> None:
        def put() -> None:
            at = 0
            for s, per in zip(self.pipeline.stages, self._sizes, strict=False):
                n = per * len(blocks)
                s.write(self.pid, blocks, data[at : at + n])
                at += n

        self._on_stages("writing KV blocks", put)

    def copy_block(self, src: int, dst: int) -> None:
        self._on_stages("copying a KV block", lambda: [s.copy(self.pid, src, dst) for s in self.pipeline.stages])

    def write_kv(self, blocks: list[int], k: np.ndarray, v: np.ndarray) -> None:
        """Fill `blocks` from all-layer K/V arrays [layers, n, block_tokens, heads, dim] (a P/D frame
        imported into a pipelined decode worker): each stage gets its own layers' slice."""
        def put() -> None:
            for s in self.pipeline.stages:
                lo, hi = s.band
                s.write(self.pid, blocks, np.ascontiguousarray(k[lo:hi]).tobytes() + np.ascontiguousarray(v[lo:hi]).tobytes())

        self._on_stages("importing a KV frame", put)


class PipelineModel(Model):
    """A Model whose layers run on pipeline stages; the embedding and the head run here."""

    def __init__(self, model: Model, pipeline: Pipeline) -> None:
        super().__init__(model.config, model.weights, name=model.name, tensor_types=model.tensor_types,
                         identity=model.identity)
        self.prefill_blas = model.prefill_blas
        self.kv_dtype = model.kv_dtype
        self.pipeline = pipeline

    def new_pool(self, num_blocks: int | None = None, block_tokens: int = 16) -> BlockPool:
        """A scheduler's pool (each scheduler over this pipeline gets its own on every stage)."""
        return StagedPool(self.pipeline, self.config, num_blocks, block_tokens)

    def forward(self, ids: np.ndarray, lanes: list[LaneInput], decode: bool,
                trace: list[np.ndarray] | None = None, all_logits: bool = False, head: bool = True,
                out: Scratch | None = None) -> np.ndarray:
        if trace is not None:
            raise EngineError("a pipeline forward cannot trace the residual stream")
        ids = np.asarray(ids, dtype=np.int64)
        pools = {id(ln.kv.pool) for ln in lanes}
        if len(pools) != 1 or not isinstance(lanes[0].kv.pool, StagedPool):
            raise EngineError("a pipeline forward takes lanes of one of its own pools")
        pool = lanes[0].kv.pool
        if self.pipeline.head_last:
            return self.pipeline.run(self.embed_rows(ids), lanes, decode, pool, {"all_logits": all_logits, "head": head})
        x = self.pipeline.run(self.embed_rows(ids), lanes, decode, pool)
        return self.finish(x, lanes, all_logits, head, out=out)

    def embed(self, ids: list[int] | np.ndarray) -> np.ndarray:
        raise EngineError("embeddings are not served by a pipeline (its one KV pool is the scheduler's)")

    def close(self) -> None:
        self.pipeline.close()


def local_pipeline(model: Model, plan: PartitionPlan, *, micro_batches: int = 0, head_last: bool = True) -> PipelineModel:
    """Every stage a thread of this process, linked by queues (the reference the process links match)."""
    stages = [LocalStage(Stage(model, lo, hi)) for lo, hi in plan.bands]
    links = [QueueLink() for _ in range(len(stages) + 1)]
    for i, s in enumerate(stages):
        s.start(links[i], links[i + 1])
    return PipelineModel(model, Pipeline(model, stages, links[0], links[-1], micro_batches=micro_batches,
                                         head_last=head_last))


def _wire(model: Model, stages: list[RemoteStage], transport: str, ring_bytes: int,
          timeout: float, link: LinkKey | None = None) -> tuple[Any, Any]:
    """Link the stages in order (each one's outbound to the next's inbound) and the head to both ends;
    returns the head's (outbound, inbound). Run again after a stage is replaced: every link is renewed."""
    bands = [s.layers for s in stages]
    edges = [0] + [hi for _, hi in bands]
    if [lo for lo, _ in bands] != edges[:-1] or edges[-1] != model.config.n_layers:
        raise EngineError(f"stage workers hold layers {[f'{lo}:{hi}' for lo, hi in bands]}: they must cover "
                          f"0:{model.config.n_layers} in order, without gaps or overlaps")
    for s in stages:
        if s.hello.get("identity") != model.identity.hex():
            raise EngineError(f"stage worker {s.address} serves another model")
    ins = [s.call({"op": "inbound", "transport": transport, "ring_bytes": ring_bytes})[0] for s in stages]
    if transport == "shm":
        back: Any = RingReceiver(ring_bytes)
        nexts: list[Any] = [i.get("ring") for i in ins[1:]] + [back.name]
    else:
        nexts = [s.address for s in stages[1:]] + [None]
    for s, nxt in zip(stages, nexts, strict=False):
        s.call({"op": "outbound", "transport": transport, "next": nxt})
    if transport == "shm":
        return RingSender(str(ins[0]["ring"])), back
    host, port = parse_address(stages[-1].address)
    sink = Channel.connect(host, port, peer=f"stage {stages[-1].address} (results)", key=link)
    sink.send({"op": "hello", "as": "sink", "protocol": PROTOCOL})
    sink.recv(timeout)
    host, port = parse_address(stages[0].address)
    up = Channel.connect(host, port, peer=f"stage {stages[0].address}", key=link)
    up.send({"op": "hello", "as": "upstream", "protocol": PROTOCOL})
    up.recv(timeout)
    return ChannelLink(up), ChannelLink(sink)


def rejoin_in_place(addresses: list[str], link: LinkKey | None = None,
                    hold_s: float = 30.0) -> Callable[[int, str], str]:
    """A `rejoin` for stage workers nobody supervises (`--stage-workers`): wait, at most hold_s, for stage i
    to answer at its address again (a link that heals, a host that comes back with its worker), then the
    pipeline re-links and recomputes. A stage that stays away fails the forward with why."""
    from engine.wire.node import probe

    def rejoin(i: int, why: str) -> str:
        deadline = time.monotonic() + hold_s
        while True:
            try:
                probe(addresses[i], timeout=2.0, key=link)
                return addresses[i]
            except (EngineError, OSError, ValueError):
                if time.monotonic() > deadline:
                    raise EngineError(f"stage worker {addresses[i]} did not come back within {hold_s:.0f} s") from None
                time.sleep(0.5)

    return rejoin


def remote_pipeline(model: Model, addresses: list[str], *, transport: str = "tcp", micro_batches: int = 0,
                    ring_bytes: int = 256 << 20, timeout: float = 30.0, head_last: bool = True,
                    rejoin: Callable[[int, str], str] | None = None, link: LinkKey | None = None) -> PipelineModel:
    """Stages in `fak worker --role stage` processes, in layer order, linked stage to stage (tcp or shm).
    `rejoin(i, why)`: how to get stage i back after it went away (its new address, once it is up: a
    supervisor such as Ray restarts it); without one a lost stage fails the requests it held."""
    if transport not in ("tcp", "shm"):
        raise EngineError(f"pipeline transport across processes is tcp or shm, not {transport!r}")
    stages: list[RemoteStage] = []
    try:
        for a in addresses:
            stages.append(RemoteStage(a, timeout, link))
        out, back = _wire(model, stages, transport, ring_bytes, timeout, link)
    except BaseException:
        for s in stages:
            s.close()
        raise
    p = Pipeline(model, stages, out, back, micro_batches=micro_batches, transport=transport, head_last=head_last)
    p.rejoin, p.ring_bytes, p.connect_timeout, p.link = rejoin, ring_bytes, timeout, link
    return PipelineModel(model, p)
