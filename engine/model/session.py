"""Sessions: one lane's token history and paged KV cache; prefill, step, and batched steps.

Blocks are reserved (and shared blocks copied on write) BEFORE anything is mutated, so a
KVExhausted from a fixed shared pool leaves every session exactly as it was: the scheduler can
preempt someone and retry.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from engine.errors import EngineError
from engine.kernels.parallel import warming
from engine.model.forward import LaneInput, Model
from engine.model.kv import BlockPool, KVExhausted, PageTable
from engine.model.scratch import Scratch


class Session:
    """A sequence being decoded. `kv.length` positions are filled; `tokens` are the ids fed so far."""

    def __init__(self, model: Model, pool: BlockPool | None = None) -> None:
        self.model = model
        self.kv = PageTable(pool if pool is not None else model.new_pool(None))
        self.tokens: list[int] = []

    @property
    def pool(self) -> BlockPool:
        return self.kv.pool

    @property
    def length(self) -> int:
        return self.kv.length

    def prefill(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Append `ids` at positions length.. and return the logits [vocab] of the last one."""
        arr = _ids(ids, self.model.config.vocab_size)
        if arr.size == 0:
            raise EngineError("prefill of an empty prompt")
        _reserve([self], [arr.size])
        logits = self.model.forward(arr, [LaneInput(self.kv, int(arr.size))], decode=False)
        self._advance(arr)
        return logits[0]

    def step(self, token: int) -> np.ndarray:
        """Feed one token (the decode path) and return the next-token logits [vocab]."""
        return step_batch([self], [token])[0]

    def truncate(self, n: int) -> None:
        """Keep positions 0..n-1 only (rejected speculative rows): the length and the ids go back, and
        blocks past the last one n positions need return to the pool; nothing is copied."""
        if not 0 <= n <= self.length:
            raise EngineError(f"truncate to {n} positions: the session holds {self.length}")
        self.kv.truncate(n)
        del self.tokens[n:]

    def free(self) -> None:
        """Return every KV block to the pool (shared blocks survive for their other owners)."""
        self.kv.free()
        self.tokens = []

    def _advance(self, arr: np.ndarray) -> None:
        self.kv.length += int(arr.size)
        self.tokens.extend(int(t) for t in arr)


class BatchSession:
    """A fixed group of sessions advanced together (see `step_batch` for a changing set)."""

    def __init__(self, sessions: Sequence[Session]) -> None:
        self.sessions = list(sessions)

    def step_batch(self, ids: Sequence[int]) -> np.ndarray:
        return step_batch(self.sessions, ids)


def step_batch(sessions: Sequence[Session], ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Advance N sessions (of one model) one token each: one batched matmul per weight.

    Returns logits [N, vocab], bit-identical to N serial `step` calls (a one-token `forward_batch`).
    """
    sessions = list(sessions)
    arr = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids).reshape(-1, 1)
    if len(arr) != len(sessions):
        raise EngineError(f"step_batch: {len(sessions)} sessions but {len(arr)} ids")
    return forward_batch(sessions, arr)


def forward_batch(sessions: Sequence[Session], chunks: Sequence[Sequence[int]],
                  logit_rows: Sequence[int] | None = None, out: Scratch | None = None) -> np.ndarray:
    """Advance N sessions by a chunk of tokens each (prefill chunks and single decode tokens mixed)
    in ONE forward on the row-stable decode kernels; returns each session's last-token logits [N, vocab]
    (with `logit_rows`, the logits of session i's last logit_rows[i] rows, in order: [sum, vocab]; with
    `out`, possibly a view of its buffer: valid until its next use).

    Every row is computed as a serial `step` would compute it, so the result does not depend on the
    batch mates or on how a prompt was chunked (the continuous-batching scheduler relies on this).
    All blocks are reserved before anything is mutated (KVExhausted leaves every session unchanged).
    """
    sessions = list(sessions)
    if not sessions:
        return np.zeros((0, 0), dtype=np.float32)
    model = sessions[0].model
    if any(s.model is not model for s in sessions):
        raise EngineError("forward_batch: sessions belong to different models")
    if len({id(s) for s in sessions}) != len(sessions):
        raise EngineError("forward_batch: a session appears twice in one batch")
    if len(chunks) != len(sessions):
        raise EngineError(f"forward_batch: {len(sessions)} sessions but {len(chunks)} chunks")
    arrs = [_ids(c, model.config.vocab_size) for c in chunks]
    if any(a.size == 0 for a in arrs):
        raise EngineError("forward_batch: an empty chunk")
    if logit_rows is not None and (len(logit_rows) != len(arrs)
                                   or any(not 1 <= m <= a.size for m, a in zip(logit_rows, arrs, strict=False))):
        raise EngineError(f"forward_batch: logit rows {list(logit_rows)} for chunks of {[a.size for a in arrs]}")
    rows = logit_rows if logit_rows is not None else [1] * len(arrs)
    _reserve(sessions, [int(a.size) for a in arrs])
    lanes = [LaneInput(s.kv, int(a.size), logits=int(m)) for s, a, m in zip(sessions, arrs, rows, strict=False)]
    logits = model.forward(np.concatenate(arrs), lanes, decode=True, out=out)
    for s, a in zip(sessions, arrs, strict=False):
        s._advance(a)
    return logits


def _ids(ids: Sequence[int] | np.ndarray, vocab: int) -> np.ndarray:
    arr = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, dtype=np.int64).reshape(-1)
    if arr.size and (arr.min() < 0 or arr.max() >= vocab):
        bad = int(arr[(arr < 0) | (arr >= vocab)][0])
        raise EngineError(f"token id {bad} out of range for vocab {vocab}")
    return arr


def _cow_blocks(kv: PageTable, n_new: int) -> list[int]:
    """Indices into kv.blocks of existing blocks the write will touch that someone else also holds."""
    bt = kv.pool.block_tokens
    first, last = kv.length // bt, (kv.length + n_new - 1) // bt
    return [i for i in range(first, min(last + 1, len(kv.blocks))) if kv.pool.refcount[kv.blocks[i]] > 1]


def blocks_to_reserve(sessions: Sequence[Session], counts: Sequence[int]) -> int:
    """New blocks `counts[i]` more tokens in each session take (fresh ones and copies of shared ones)."""
    return sum(s.kv.blocks_needed(s.kv.length + n) + len(_cow_blocks(s.kv, n)) for s, n in zip(sessions, counts, strict=True))


def _reserve(sessions: Sequence[Session], counts: Sequence[int]) -> None:
    """Reserve room for counts[i] more tokens in each session, all or nothing."""
    need: dict[int, int] = defaultdict(int)
    pools: dict[int, BlockPool] = {}
    for s, n in zip(sessions, counts, strict=False):
        need[id(s.pool)] += blocks_to_reserve([s], [n])
        pools[id(s.pool)] = s.pool
    for key, n in need.items():
        pool = pools[key]
        if not pool.growable and n > pool.num_free:
            raise KVExhausted(f"KV pool exhausted: need {n} blocks, {pool.num_free} free of {pool.capacity}")
    for s, n in zip(sessions, counts, strict=False):
        for i in _cow_blocks(s.kv, n):
            old = s.kv.blocks[i]
            new = s.pool.allocate()
            s.pool.copy_block(old, new)
            s.pool.release(old)
            s.kv.blocks[i] = new
        s.kv.reserve(s.kv.length + n)


def warmup(model: Model | None = None, kv_dtype: str = "f32") -> None:
    """Load (or compile, first time) every numba kernel of prefill, step and step_batch, so no
    request pays for it. The kernels' types do not depend on the model, so the tiny synthetic
    checkpoint warms them for every model; pass a model to also touch its weights once. Resident
    weights' kernels are warmed too, for the tile kind groups the loaded weights hold (so call it after
    the load; engine.model.resident.warmup). `kv_dtype`: the KV pools' element
    type the kernels are compiled for (each is its own specialisation)."""
    from engine.model.compile_ahead import start
    from engine.model.resident import warmup as warm_resident

    ahead = start(kv_dtype)  # cold cache: the lane kernel compiles in a second process meanwhile
    try:
        warm_resident()
        if model is None:
            from engine.model.synthetic import synthetic_model

            model = synthetic_model()
            model.kv_dtype = kv_dtype
        if model.lane_plan() is not None:
            ahead.wait()  # its steps run the lane kernel: take it from the helper's cache
        with warming():  # both the parallel kernels and their serial twins
            a, b = Session(model), Session(model)
            a.prefill([1, 2])
            b.prefill([3])
            a.step(4)
            step_batch([a, b], [5, 6])
            a.free()
            b.free()
        s = _tiled_session(kv_dtype)  # the one-kernel single-lane step (engine/kernels/lane_kernel.py)
        if s is not None:
            s.prefill([1, 2])
            ahead.wait()
            s.step(3)
            s.free()
    finally:
        ahead.wait()


def _tiled_session(kv_dtype: str) -> Session | None:
    """A session on the synthetic resident checkpoint (Q8_0 tiles, pools of `kv_dtype`), or None when the
    lane kernel does not cover it (one thread, FAK_LANE_KERNEL=0): nothing of that kernel to warm."""
    from engine.model.synthetic import synthetic_resident_model

    model = synthetic_resident_model()
    model.kv_dtype = kv_dtype
    return Session(model) if model.lane_plan() is not None else None


def warm_lane_kernel(kv_dtype: str = "f32") -> None:
    """Compile (or load) the single-lane kernel alone, for pools of `kv_dtype`: a one-token prefill of the
    synthetic resident checkpoint (one row: the lane kernel with the head). What a cold warmup's helper
    process runs (engine/model/compile_ahead.py); nothing when the kernel is off (one thread, FAK_LANE_KERNEL=0)."""
    s = _tiled_session(kv_dtype)
    if s is not None:
        s.prefill([1])
        s.free()
