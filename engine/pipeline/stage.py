"""Stage: one pipeline stage, a band of layers [lo, hi) with a KV pool that holds only those layers.

With `finish` in a message, the last stage also applies the output norm and the LM head and returns
logits (for small models the head is the biggest matrix: it belongs to a stage, not to the scheduler's
process). The head's scheduler owns the block allocator (engine/pipeline/pipeline.py StagedPool); a stage's pool is
storage indexed by the same block ids, grown to fit them. A forward message carries, per lane, a key, its
start position, its token count and its block table as a delta against what this stage was last told
(None: unchanged, ["+", ids]: appended, ["=", ids]: replaced): a decode step moves one hidden row per lane
and a few ints, never the history. Control calls (swap out / in, copy-on-write) act on the same block ids.

`serve(stage, inbound, outbound)` is a stage's loop, the same for a thread in the head's process and for
a `fak worker --role stage` process: forward messages in order, each result to the next stage or back.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from engine.errors import EngineError
from engine.model.forward import LaneInput
from engine.model.kv import BlockPool, PageTable
from engine.wire.transport import TransportClosed, TransportTimeout


class Stage:
    def __init__(self, model: Any, lo: int, hi: int, block_tokens: int = 16, num_blocks: int | None = None) -> None:
        c = model.config
        if not 0 <= lo < hi <= c.n_layers:
            raise EngineError(f"stage layers {lo}:{hi}: expected 0 <= lo < hi <= {c.n_layers}")
        self.model, self.lo, self.hi = model, lo, hi
        # one pool per scheduler the head runs over this pipeline (each a group of lanes in flight), by id
        self.pools: dict[int, BlockPool] = {0: self.new_pool(num_blocks, block_tokens)}
        self.tables: dict[int, list[int]] = {}
        self.gen = 0  # the head's pipeline generation this stage was last set up for
        self.lock = threading.Lock()  # a forward and a control call never interleave
        self.stats: dict[str, float] = {"steps": 0, "rows": 0, "busy_s": 0.0, "bytes_in": 0, "bytes_out": 0}

    def new_pool(self, num_blocks: int | None, block_tokens: int) -> BlockPool:
        c = self.model.config
        return BlockPool(self.hi - self.lo, c.n_kv_heads, c.head_dim, num_blocks=num_blocks, block_tokens=block_tokens,
                         kv_dtype=getattr(self.model, "kv_dtype", "f32"))

    def reset_pool(self, pid: int, num_blocks: int | None, block_tokens: int, gen: int = 0) -> int:
        """(Re)create pool `pid` to the head's budget, for the head's pipeline generation `gen` (messages of an
        older generation, left in a link by a stage that went away, are dropped); returns its bytes per block."""
        with self.lock:
            if gen > self.gen:
                self.gen = gen
                self.tables.clear()
            self.pools[pid] = self.new_pool(num_blocks, block_tokens)
            return self.pools[pid].block_bytes

    def pool(self, pid: int) -> BlockPool:
        try:
            return self.pools[pid]
        except KeyError:
            raise EngineError(f"stage {self.lo}:{self.hi}: no KV pool {pid}") from None

    def _fit(self, pool: BlockPool, blocks: list[int]) -> None:
        top = max(blocks, default=-1)
        while top >= pool.capacity:
            if not pool.growable:
                raise EngineError(f"stage {self.lo}:{self.hi}: block {top} beyond its pool of {pool.capacity}")
            pool._grow()

    def run(self, header: dict[str, Any], blob: memoryview) -> np.ndarray | None:
        """One forward message: hidden rows in, hidden rows out (this band's layers applied); None for a
        message of an older pipeline generation (dropped)."""
        if int(header.get("gen", 0)) < self.gen:
            return None
        t0 = time.perf_counter()
        hidden = int(self.model.config.hidden)
        x = np.frombuffer(blob, dtype=np.float32).reshape(-1, hidden).copy()
        with self.lock:
            pool = self.pool(int(header.get("pool", 0)))
            for key in header.get("drop", ()):
                self.tables.pop(int(key), None)
            lanes = []
            for key, start, n, op in header["lanes"]:
                if op is not None:
                    kind, ids = op
                    self._fit(pool, ids)
                    self.tables[key] = list(ids) if kind == "=" else self.tables[key] + list(ids)
                blocks = self.tables[key]
                lanes.append(LaneInput(PageTable(pool, blocks, start), int(n), int(start)))
            y = self.model.run_layers(x, lanes, bool(header["decode"]), self.lo, self.hi, kv_layer0=self.lo)
            fin = header.get("finish")
            if fin is not None and self.hi == self.model.config.n_layers:  # the last stage holds the LM head too
                y = self.model.finish(y, lanes, bool(fin.get("all_logits")), bool(fin.get("head", True)))
        st = self.stats
        st["steps"] += 1
        st["rows"] += x.shape[0]
        st["busy_s"] += time.perf_counter() - t0
        st["bytes_in"] += len(blob)
        st["bytes_out"] += y.nbytes
        return np.ascontiguousarray(y, dtype=np.float32)

    # -- control (the head's pipeline idle between forwards: ordered against them by the caller)
    def read(self, pid: int, blocks: list[int]) -> bytes:
        with self.lock:
            pool = self.pool(pid)
            self._fit(pool, blocks)
            return pool.read_blocks(blocks)

    def write(self, pid: int, blocks: list[int], data: bytes | memoryview) -> None:
        with self.lock:
            pool = self.pool(pid)
            self._fit(pool, blocks)
            pool.write_blocks(blocks, bytes(data))

    def copy(self, pid: int, src: int, dst: int) -> None:
        with self.lock:
            pool = self.pool(pid)
            self._fit(pool, [src, dst])
            pool.copy_block(src, dst)

    def info(self) -> dict[str, Any]:
        return {"layers": [self.lo, self.hi], "pools": len(self.pools),
                "pool_blocks": sum(p.capacity for p in self.pools.values()), "tables": len(self.tables), **self.stats}


def serve(stage: Stage, inbound: Any, outbound: Any, stop: threading.Event) -> None:
    """Forward messages from `inbound`, results to `outbound`, until stopped or a link closes. An error in
    a forward goes downstream as the message's error, so the head fails that step instead of waiting."""
    while not stop.is_set():
        try:
            header, blob = inbound.recv(0.2)
        except TransportTimeout:
            continue
        except TransportClosed:
            return
        if header.get("error"):
            out, y = header, np.zeros(0, np.float32)
        else:
            try:
                y = stage.run(header, blob)
                if y is None:
                    continue
                out = header
            except Exception as e:  # reported, not raised: the loop must outlive a bad message
                out, y = {**header, "error": f"stage {stage.lo}:{stage.hi}: {type(e).__name__}: {e}"}, np.zeros(0, np.float32)
        try:
            outbound.send(out, y)
        except TransportClosed:
            continue  # the next hop went away: this answer is lost (the head recovers), the inbound lives on
