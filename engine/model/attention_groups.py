"""How a forward batch's lanes reach attention: K/V writes and attention calls grouped per KV pool.

Decode rows (and short chunks) of all lanes that share a pool go through ONE `batched_attention`
call per layer, which also stores their K/V; a long prefill chunk (with BLAS prefill on) goes alone through
`prefill_attention`. The grouping is computed once per forward and reused by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.kernels.attention import PREFILL_ATTN_MIN_ROWS, RaggedRows, batched_attention, prefill_attention
from engine.model.kv import BlockPool


@dataclass
class PrefillLane:
    """One long prefill chunk: rows r0..r1-1 of the batch, attention through BLAS."""

    lane: Any  # model.LaneInput
    r0: int
    r1: int

    def attend(self, li: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray, window: int,
               scale: float, softcap: float) -> None:
        kv, r0, r1 = self.lane.kv, self.r0, self.r1
        kv.write(li, self.lane.start, k[r0:r1], v[r0:r1])
        out[r0:r1] = prefill_attention(q[r0:r1], kv.pool.k[li], kv.pool.v[li], kv.blocks, self.lane.start, window,
                                       scale, softcap)


@dataclass
class PoolRows:
    """Rows of every other lane sharing `pool`: one attention call per layer, which also stores their K/V."""

    pool: BlockPool
    rows: np.ndarray  # int64 indices into the batch's rows
    ragged: RaggedRows
    dest_block: np.ndarray  # [len(rows)] block id each row's K/V lands in
    dest_off: np.ndarray  # [len(rows)] offset inside that block

    whole: bool = False  # rows are every row of the batch, in order: no gather, no scatter

    def attend(self, li: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray, window: int,
               scale: float, softcap: float) -> None:
        if self.whole:  # the kernel stores the rows' K/V and writes `out` itself
            new = (np.ascontiguousarray(k), np.ascontiguousarray(v), self.dest_block, self.dest_off)
            batched_attention(q, self.pool.k[li], self.pool.v[li], self.ragged, window, scale, softcap, new, out)
            return
        new = (np.ascontiguousarray(k[self.rows]), np.ascontiguousarray(v[self.rows]), self.dest_block, self.dest_off)
        out[self.rows] = batched_attention(q[self.rows], self.pool.k[li], self.pool.v[li], self.ragged, window,
                                           scale, softcap, new)


def attention_groups(lanes: list[Any], blas: bool) -> list[PrefillLane | PoolRows]:
    """Group the lanes of one forward (their KV blocks already reserved) for attention."""
    out: list[PrefillLane | PoolRows] = []
    by_pool: dict[int, tuple[BlockPool, list[tuple[Any, int]]]] = {}
    r0 = 0
    for ln in lanes:
        if blas and ln.n >= PREFILL_ATTN_MIN_ROWS:
            out.append(PrefillLane(ln, r0, r0 + ln.n))
        else:
            by_pool.setdefault(id(ln.kv.pool), (ln.kv.pool, []))[1].append((ln, r0))
        r0 += ln.n
    for pool, members in by_pool.values():
        ragged = RaggedRows.of([ln.kv.blocks for ln, _ in members], [ln.start for ln, _ in members],
                               [ln.n for ln, _ in members], pool.block_tokens)
        rows = np.concatenate([np.arange(r, r + ln.n, dtype=np.int64) for ln, r in members])
        bt = pool.block_tokens
        dest = ragged.tables[ragged.row_lane, ragged.row_pos // bt]
        whole = len(rows) == r0 and bool(np.array_equal(rows, np.arange(r0)))
        out.append(PoolRows(pool, rows, ragged, dest, ragged.row_pos % bt, whole))
    return out
