"""Causal (optionally sliding-window) attention over a lane's paged KV blocks.

Decode rows (and short chunks): one numba kernel reads K/V in place through each lane's block table
(no gather copy); each (query row, head) is computed by the same loop in the same order whatever the
batch, so a serial step and a batched step agree bit for bit. Long prefill chunks: `prefill_attention`,
flash-style over key tiles through BLAS (not row-stable; only prefill chunks use it, as they do for the
weight products).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np
from numba import njit, prange

from engine.errors import EngineError
from engine.kernels.blockdot import max_f32, prefetch_ahead, sum_f32
from engine.kernels.i16tile import QB, TILE, block_count, build_tiles, build_tiles_t, quantize_rows, tile_count, tile_products
from engine.kernels.kvtype import TILE_BLOCK, TILE_KEYS, kv_get, kv_key_tiles, kv_put, kv_pvs4, kv_pvs8, tile_scores
from engine.kernels.ops import _exp32
from engine.kernels.parallel import ORDERED_FASTMATH, SMALL_WORK, launch, prefill_pool, prefill_workers

# Key positions per decode-attention task: a fixed number of K bytes (KV_TASK_BYTES / (4 * head_dim)
# positions, at least one block of key tiles: 64), the same for every row of a model, so a row's bits never depend on the batch
# or the threads. Why this small: at decode the K/V of a layer come cold from DRAM (a step streams
# more weight bytes than the L3 holds), and one core pulls about half of what two do; splitting a
# 100-token context into tasks puts both cores on it (bench/breakdown.py on Gemma 3 270M: attention
# 1.4-1.8 -> 0.7-0.8 ms a step, with the K/V store moved into the kernel; the step total moved within noise).
# Why at least 64: kvtype.tile_scores walks the keys 64 at a time; Gemma 3's 16-position chunks (head_dim 256)
# computed four times the scores they kept (16 lanes of stories: 0.97-0.99x -> 0.94x with speculation on).
KV_TASK_BYTES = 16 << 10
TASK_SPANS = 16  # spans of tasks the threads share out (each allocates its scratch once)
PAR_KV_BYTES = 48 << 10  # K+V bytes a call reads below which one thread runs it (waking the team costs more)


def chunk_positions(head_dim: int) -> int:
    return max(TILE_KEYS * TILE_BLOCK, KV_TASK_BYTES // (4 * head_dim))


@njit(cache=True)
def key_tiles(n: int) -> int:
    """Key tiles attend_chunk's scratch holds for n positions: kvtype.tile_scores walks them TILE_BLOCK at a time."""
    return -(-n // (TILE_KEYS * TILE_BLOCK)) * TILE_BLOCK


@njit(cache=True)
def score_columns(n: int) -> int:
    """Columns a head's score row needs for n positions (tile_scores writes whole blocks of tiles)."""
    return key_tiles(n) * TILE_KEYS


# Every sum adds in the order written (each q.k one FMA chain over the dimensions in order, kvtype.tile_scores; the
# softmax sums through blockdot.sum_f32, one fixed order; P.V per output value in position order; the chunks combined in
# position order), so the serial twin and the parallel kernel give the same bits whatever the compiler does with the
# loops (tests/engine/kernels/test_twins.py), and a row's result depends on its own positions only.
@njit(parallel=True, nogil=True, fastmath=ORDERED_FASTMATH, error_model="numpy", cache=True)
def _paged_attention(
    q: np.ndarray,  # [R, H, D] f32, C-contiguous: query rows of one or more lanes
    k_pool: np.ndarray,  # [blocks, bt, KVH, D] (one layer of the pool), rows of D contiguous
    v_pool: np.ndarray,
    tables: np.ndarray,  # [lanes, max_blocks] int64 block ids of each lane, in position order
    row_lane: np.ndarray,  # [R] int64: the lane of each query row
    row_pos: np.ndarray,  # [R] int64: the absolute position of each query row
    window: int,  # 0 = unbounded
    scale: float,
    softcap: float,  # 0 = off
    chunk: int,  # key positions per task (chunk_positions)
    k_new: np.ndarray,  # [R, KVH, D] or [0, KVH, D]: the rows' own K/V, written to the pool first
    v_new: np.ndarray,
    dest_block: np.ndarray,  # [R] int64: where row r's K/V go (block id, offset in the block)
    dest_off: np.ndarray,
    out: np.ndarray,  # [R, H, D]
) -> None:  # pragma: no cover - numba
    """Split-K decode attention: a task is (row, KV head, `chunk` positions); it reads each K and V
    row once for all the query heads sharing that KV head (Gemma 3: 4) and keeps a partial softmax
    (max, sum, unnormalised P.V); a second pass merges a row's chunks in order. With k_new rows, the
    rows' own K/V are stored into the pool before any is read (one call per layer, no numpy scatter)."""
    t_rows, n_heads, dim = q.shape
    bt, kvh = k_pool.shape[1], k_pool.shape[2]
    group = n_heads // kvh
    if q.strides[2] != 4 or q.strides[1] != 4 * dim or k_pool.strides[3] != k_pool.itemsize or k_pool.shape[3] != dim:
        raise ValueError("paged attention: q and K must hold contiguous rows of head_dim")  # raw reads below
    if v_pool.strides[3] != v_pool.itemsize or v_pool.shape[3] != dim or v_pool.shape[2] != kvh or chunk < 1:
        raise ValueError("paged attention: V must hold contiguous rows of head_dim")
    if k_new.shape[0] != 0:
        if (k_new.shape[0] != t_rows or v_new.shape[0] != t_rows or k_new.shape[1] != kvh or k_new.shape[2] != dim
                or v_new.shape[1] != kvh or v_new.shape[2] != dim or dest_block.shape[0] != t_rows
                or dest_off.shape[0] != t_rows):
            raise ValueError("paged attention: new K/V rows do not match the query rows")
        if (k_new.strides[2] != 4 or k_new.strides[1] != 4 * dim or v_new.strides[2] != 4
                or v_new.strides[1] != 4 * dim):
            raise ValueError("paged attention: new K/V rows must be contiguous float32")
        for t in range(t_rows):
            kv_put(k_pool, np.uint64(k_pool[dest_block[t], dest_off[t]].ctypes.data), np.uint64(k_new[t].ctypes.data),
                   kvh * dim)
            kv_put(v_pool, np.uint64(v_pool[dest_block[t], dest_off[t]].ctypes.data), np.uint64(v_new[t].ctypes.data),
                   kvh * dim)
    qa, ka, va = np.uint64(q.ctypes.data), np.uint64(k_pool.ctypes.data), np.uint64(v_pool.ctypes.data)
    ks0, ks1, ks2 = np.uint64(k_pool.strides[0]), np.uint64(k_pool.strides[1]), np.uint64(k_pool.strides[2])
    vs0, vs1, vs2 = np.uint64(v_pool.strides[0]), np.uint64(v_pool.strides[1]), np.uint64(v_pool.strides[2])
    first = np.zeros(t_rows + 1, dtype=np.int64)  # row t's chunks: first[t] .. first[t + 1] - 1
    los = np.empty(t_rows, dtype=np.int64)
    for t in range(t_rows):
        lo = 0
        if window > 0 and row_pos[t] - window + 1 > 0:
            lo = row_pos[t] - window + 1
        los[t] = lo
        first[t + 1] = first[t] + (row_pos[t] - lo + chunk) // chunk
    nch = first[t_rows]
    # runs: a lane's consecutive rows at consecutive positions whose chunks start at the same place (a draft's
    # verification rows; not under a sliding window that has moved). A task is (run, chunk, KV head): the
    # chunk's keys are transposed into tiles and its values widened once for every row of the run that reads them.
    run_row = np.zeros(t_rows + 1, dtype=np.int64)  # run i: rows run_row[i] .. run_row[i + 1] - 1
    nruns = 0
    for t in range(t_rows):
        if t == 0 or row_lane[t] != row_lane[t - 1] or row_pos[t] != row_pos[t - 1] + 1 or los[t] != los[t - 1]:
            run_row[nruns] = t
            nruns += 1
    run_row[nruns] = t_rows
    run_first = np.zeros(nruns + 1, dtype=np.int64)  # run i's chunks (its last row's): run_first[i] ..
    for i in range(nruns):
        last = run_row[i + 1] - 1
        run_first[i + 1] = run_first[i] + first[last + 1] - first[last]
    part_m = np.empty((nch, kvh, group), dtype=np.float32)
    part_l = np.empty((nch, kvh, group), dtype=np.float32)
    part_o = np.empty((nch, kvh, group, dim), dtype=np.float32)
    tasks = run_first[nruns] * kvh
    spans = min(tasks, TASK_SPANS)
    for sp in prange(spans):  # scratch once per span of tasks, not per task (3 allocations a task: ~1/4 of its time)
        s = np.empty((group, score_columns(chunk)), dtype=np.float32)
        rows = np.empty((2, chunk), dtype=np.uint64)
        kt = np.empty((key_tiles(chunk), dim, TILE_KEYS), dtype=np.float32)
        vw = np.empty((chunk, dim), dtype=np.float32)
        for task in range(tasks * sp // spans, tasks * (sp + 1) // spans):
            rc, kh = task // kvh, task % kvh
            ri = np.searchsorted(run_first, rc, side="right") - 1
            c = rc - run_first[ri]
            a, b = run_row[ri], run_row[ri + 1]
            lo = los[a] + c * chunk
            n = min(row_pos[b - 1] + 1, lo + chunk) - lo
            table = tables[row_lane[a]]
            if b - a == 1:
                attend_chunk(k_pool, v_pool, qa + np.uint64(a * n_heads * dim * 4), ka, va, ks0, ks1, ks2, vs0, vs1,
                             vs2, table, bt, kh, lo, n, scale, softcap, s, rows, kt, part_m[first[a] + c, kh],
                             part_l[first[a] + c, kh], part_o[first[a] + c, kh])
                continue
            chunk_rows(ka, va, ks0, ks1, ks2, vs0, vs1, vs2, table, bt, kh, lo, n, rows)
            kv_key_tiles(k_pool, np.uint64(rows[0].ctypes.data), n, dim, np.uint64(kt.ctypes.data))
            wa = np.uint64(vw.ctypes.data)
            for j in range(n):  # the values widened once; the rows' P.V read them as float32 (the same bits)
                kv_get(v_pool, wa + np.uint64(j * dim * 4), rows[1, j], dim)
                rows[1, j] = wa + np.uint64(j * dim * 4)
            for t in range(a, b):
                if c >= first[t + 1] - first[t]:
                    continue  # the run's earlier rows end a chunk sooner
                nt = min(row_pos[t] + 1, lo + chunk) - lo
                ci = first[t] + c
                chunk_softmax_pv(vw, qa + np.uint64(t * n_heads * dim * 4), kh, nt, scale, softcap, s, rows, kt,
                                 part_m[ci, kh], part_l[ci, kh], part_o[ci, kh])
    for th in prange(t_rows * kvh):
        t, kh = th // kvh, th % kvh
        merge_chunks(part_m[first[t]:first[t + 1], kh], part_l[first[t]:first[t + 1], kh],
                     part_o[first[t]:first[t + 1], kh], out[t, kh * group:(kh + 1) * group])


# The two halves of a decode-attention task, shared by _paged_attention and the lane kernel
# (engine/kernels/lane_kernel.py): one compiled body each, so both give the same bits.
@njit(nogil=True, fastmath=ORDERED_FASTMATH, error_model="numpy", cache=True)
def attend_chunk(kp, vp, qa, ka, va, ks0, ks1, ks2, vs0, vs1, vs2, table, bt, kh, lo, n, scale, softcap, s, rows,
                 kt, pm, pl, po):  # type: ignore[no-untyped-def]  # pragma: no cover - numba
    """Positions lo..lo+n-1 for KV head kh and its `group` query heads (q row at address qa, heads of
    `dim` floats): the partial softmax max pm[g], sum pl[g] and unnormalised P.V po[g] ([group, dim]).
    kp, vp: the K and V pools, for their element type only (engine/kernels/kvtype.py). Scratch: s
    [group, score_columns(n)], rows [2, >= n] (uint64: the K and the V rows' addresses), kt [key_tiles(n), dim,
    16] float32.

    Each K row is read once for all the group's heads: widened and transposed into key tiles of 16 positions,
    then every head's scores are one FMA a dimension for 16 positions at a time (kvtype.tile_scores), which
    also scales them and finds each head's max. Each V row is read once for up to 8 heads, whose P.V outputs
    stay in registers across the positions (kvtype.kv_pvs8 / kv_pvs4). Before, one grouped dot per position
    (a reduction tree each), serial max and sum chains and one P.V chain per head cost ~190 cycles a position
    and KV head on Qwen 2.5 0.5B's 7 heads of 64 (f16 pool, in L2); this costs ~120 (docs/engine.md)."""
    chunk_rows(ka, va, ks0, ks1, ks2, vs0, vs1, vs2, table, bt, kh, lo, n, rows)
    kv_key_tiles(kp, np.uint64(rows[0].ctypes.data), n, po.shape[1], np.uint64(kt.ctypes.data))
    chunk_softmax_pv(vp, qa, kh, n, scale, softcap, s, rows, kt, pm, pl, po)


@njit(nogil=True, fastmath=ORDERED_FASTMATH, error_model="numpy", cache=True)
def chunk_rows(ka, va, ks0, ks1, ks2, vs0, vs1, vs2, table, bt, kh, lo, n, rows):  # type: ignore[no-untyped-def]  # pragma: no cover - numba
    """The addresses of positions lo..lo+n-1's K rows (rows[0]) and V rows (rows[1]) for KV head kh."""
    # positions walk their blocks by (block, offset) counters: a division per position (p // bt, p % bt:
    # a 64-bit idiv, 40+ cycles) cost as much as the position's q.k dots
    krows, vrows = rows[0], rows[1]
    blk, off = lo // bt, lo % bt
    for j in range(n):
        krow = ka + np.uint64(table[blk]) * ks0 + np.uint64(off) * ks1 + np.uint64(kh) * ks2
        krows[j] = krow
        vrows[j] = va + np.uint64(table[blk]) * vs0 + np.uint64(off) * vs1 + np.uint64(kh) * vs2
        off += 1
        if off == bt:
            blk, off = blk + 1, 0
        prefetch_ahead(krow)  # the K rows come cold from DRAM: ask for the ones a block on


@njit(nogil=True, fastmath=ORDERED_FASTMATH, error_model="numpy", cache=True)
def chunk_softmax_pv(vp, qa, kh, n, scale, softcap, s, rows, kt, pm, pl, po):  # type: ignore[no-untyped-def]  # pragma: no cover - numba
    """attend_chunk's part per query row: its group's scores against the key tiles kt (their first n positions),
    the softmax and P.V over the V rows at rows[1] (vp: their element type)."""
    group, dim = po.shape
    srow = np.uint64(s.strides[0] // 4)
    sa = np.uint64(s.ctypes.data)
    qk = qa + np.uint64(kh * group * dim * 4)
    # the chunk's keys as tiles of 16 positions (widened and transposed once for all heads), then every
    # head's scores as one FMA chain over the dimensions per score: 4 FMAs a position and head for 64 dims,
    # against a dot and a reduction tree per position before (~75 cycles a position for Qwen's 7 heads)
    kta = np.uint64(kt.ctypes.data)
    tile_scores(kta, n, dim, qk, group, np.float32(scale), sa, np.int64(srow), np.uint64(pm.ctypes.data))
    for g in range(group):  # each head's (scaled) scores become unnormalised probabilities in place
        row = s[g]
        ga = sa + np.uint64(g) * srow * np.uint64(4)
        if softcap > 0.0:
            for j in range(n):
                row[j] = np.float32(softcap) * np.tanh(row[j] / np.float32(softcap))
            pm[g] = max_f32(ga, n)  # exact in any order; a serial max() chain cost 4 cycles a score
        m = pm[g]
        for j in range(n):
            row[j] = _exp32(row[j] - m)  # vectorisable (libm's expf is a scalar call per score)
        pl[g] = sum_f32(ga, n)  # one fixed order (32 lanes, then the tree), not a serial chain
    ra = np.uint64(rows[1].ctypes.data)
    g = 0
    while g < group:  # each V row widened once for up to 8 heads, their sums independent chains
        left = group - g
        pa = sa + np.uint64(g) * srow * np.uint64(4)
        oa = np.uint64(po[g].ctypes.data)
        if left > 4:
            take = min(left, 8)
            kv_pvs8(vp, pa, np.int64(srow), take, ra, n, dim, oa)
        else:
            take = left
            kv_pvs4(vp, pa, np.int64(srow), take, ra, n, dim, oa)
        g += take


@njit(nogil=True, fastmath=ORDERED_FASTMATH, error_model="numpy", cache=True)
def merge_chunks(pm, pl, po, out):  # type: ignore[no-untyped-def]  # pragma: no cover - numba
    """A row's chunks (pm, pl [chunks, group], po [chunks, group, dim]) merged in position order into
    out [group, dim]."""
    nc, group, dim = po.shape
    for g in range(group):
        big = np.float32(-np.inf)
        for ci in range(nc):
            big = max(big, pm[ci, g])
        tot = np.float32(0.0)
        for ci in range(nc):
            tot += np.exp(pm[ci, g] - big) * pl[ci, g]
        inv = np.float32(1.0) / tot
        orow = out[g]
        for d in range(dim):
            orow[d] = 0.0
        for ci in range(nc):
            f = np.exp(pm[ci, g] - big) * inv
            oc = po[ci, g]
            for d in range(dim):
                ud = np.uint64(d)
                orow[ud] += f * oc[ud]


def paged_attention(
    q: np.ndarray,
    k_pool: np.ndarray,
    v_pool: np.ndarray,
    blocks: list[int],
    start: int,
    window: int = 0,
    scale: float | None = None,
    softcap: float = 0.0,
) -> np.ndarray:
    """q [T, H, D] at positions start.. -> attention output [T, H, D] over positions 0..start+T-1."""
    rows = RaggedRows.of([list(blocks)], [start], [q.shape[0]], k_pool.shape[1])
    return batched_attention(q, k_pool, v_pool, rows, window, scale, softcap)


def _check_span(lane: int, n_blocks: int, start: int, rows: int, block_tokens: int) -> None:
    """Every position rows at `start` attend to (0 .. their own) must lie in one of the lane's blocks."""
    if start < 0 or rows < 0 or -(-(start + rows) // block_tokens) > n_blocks:
        raise EngineError(f"attention: lane {lane} has {n_blocks} KV blocks of {block_tokens} tokens, "
                          f"positions {start}..{start + rows - 1} need {-(-(start + rows) // block_tokens)}")


@dataclass
class RaggedRows:
    """Query rows of several lanes sharing one KV pool: each row's lane and absolute position, and
    every lane's block table (padded with -1). Built once per forward, used by every layer."""

    tables: np.ndarray  # [lanes, max_blocks] int64
    row_lane: np.ndarray  # [R] int64
    row_pos: np.ndarray  # [R] int64

    @cached_property
    def span(self) -> int:
        """Positions 0 .. span-1 hold every key a row reads (once per forward, not per layer)."""
        return int(self.row_pos.max()) + 1 if len(self.row_pos) else 0

    @classmethod
    def of(cls, block_lists: list[list[int]], starts: list[int], counts: list[int], block_tokens: int) -> RaggedRows:
        """The kernel reads blocks through these tables unchecked: every position a row attends to
        (0 .. its own) must lie in a block its lane holds."""
        for i, (b, s, n) in enumerate(zip(block_lists, starts, counts, strict=False)):
            _check_span(i, len(b), s, n, block_tokens)
        width = max(1, max(len(b) for b in block_lists))
        tables = np.full((len(block_lists), width), -1, dtype=np.int64)
        for i, b in enumerate(block_lists):
            tables[i, : len(b)] = b
        lane = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        pos = np.concatenate([np.arange(s, s + n, dtype=np.int64) for s, n in zip(starts, counts, strict=False)])
        return cls(tables, lane, pos)


def batched_attention(q: np.ndarray, k_pool: np.ndarray, v_pool: np.ndarray, rows: RaggedRows, window: int = 0,
                      scale: float | None = None, softcap: float = 0.0, new_kv: tuple[np.ndarray, ...] | None = None,
                      out: np.ndarray | None = None) -> np.ndarray:
    """Attention of the query rows of several lanes in ONE kernel call (a decode step of 16 lanes
    was 16 calls per layer). Each (row, head) runs the same loop as alone: results are unchanged.
    new_kv = (k [R, KVH, D], v, dest_block [R], dest_off [R]): the rows' own K/V, stored into the
    pool by the same call before it reads. `out`: where to write [R, H, D] (else a new array)."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if out is None:
        out = np.empty_like(q)
    t_rows, n_heads, dim = q.shape
    kvh = k_pool.shape[2]
    span = rows.span
    if window > 0:
        span = min(span, window)
    chunk = chunk_positions(dim)
    # threads by the K/V bytes read, and only with two tasks or more
    work = 0 if t_rows * kvh * -(-span // chunk) < 2 or 8 * t_rows * kvh * dim * span < PAR_KV_BYTES else SMALL_WORK
    if new_kv is None:
        k_new = v_new = _no_rows(kvh, dim)
        dest_block = dest_off = _NO_IDS
    else:
        k_new, v_new, dest_block, dest_off = new_kv
    launch(_paged_attention, work, np.ascontiguousarray(q), k_pool, v_pool, rows.tables, rows.row_lane, rows.row_pos,
           int(window), float(scale), float(softcap), chunk, k_new, v_new, dest_block, dest_off, out)
    return out


_NO_IDS = np.empty(0, np.int64)


@cache
def _no_rows(kvh: int, dim: int) -> np.ndarray:
    """"No new K/V rows": one empty array per shape, not an allocation per call."""
    return np.empty((0, kvh, dim), np.float32)


PREFILL_ATTN_MIN_ROWS = 32  # a prefill chunk this long takes the tiled BLAS attention; shorter, the numba kernel
# Key positions per tile of the prefill attention: the score tile (query vectors x KEY_TILE floats, 448 x 512
# for Qwen 2.5 0.5B's 64-row chunk) stays in a core's L2 between its two products and the softmax pass;
# 256 and 1024 measured within 5% of it at 8k positions (bench/breakdown.py --prefill).
KEY_TILE = 512


def prefill_attention(
    q: np.ndarray,
    k_pool: np.ndarray,
    v_pool: np.ndarray,
    blocks: list[int],
    start: int,
    window: int = 0,
    scale: float | None = None,
    softcap: float = 0.0,
    products: str | None = None,
) -> np.ndarray:
    """`paged_attention` for a prefill chunk, flash-style: per task (a KV head and a tile of query rows) the
    keys are walked in tiles of KEY_TILE positions, each read once per task, with an online softmax (running
    max and sum, the output rescaled as the max grows), so no score row longer than a tile is ever held and
    nothing is masked but the tile the chunk's own positions fall in. The two products of a tile go through
    single-threaded BLAS on the prefill workers, one task each; the softmax pass is one numba loop. Not
    row-stable like the decode kernel (BLAS picks its own summation order): only prefill chunks use it, as
    they do for the weight products.

    `products`: "f32" (BLAS) or "i16" (both products on int16 tiles, engine/kernels/i16tile.py: 1.3x-1.8x the
    rate; a value's error at most 6.1e-5 of its 32-value block's largest: on random operands less error than
    an f16 KV cache's rounding, on Gemma 3 at 4k positions logits moved as much as the f16 cache moves them,
    tests/engine/model/test_oracle_gemma.py). None: "i16" over a half-width pool, "f32" over a float32 one
    (whoever asked for an f32 KV cache asked for its precision)."""
    if products is None:
        products = "f32" if k_pool.dtype == np.float32 else "i16"
    if products not in ("f32", "i16"):
        raise EngineError(f"attention: products must be f32 or i16, not {products!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    t_rows, n_heads, dim = q.shape
    kvh = k_pool.shape[2]
    group = n_heads // kvh
    out = np.empty_like(q)
    table = np.asarray(blocks, dtype=np.int64)
    _check_span(0, len(table), start, t_rows, k_pool.shape[1])  # gather_rows reads through the table unchecked
    if len(table) and (table.min() < 0 or table.max() >= k_pool.shape[0]):
        raise EngineError(f"attention: block ids {table.min()}..{table.max()} outside the pool's {k_pool.shape[0]}")
    pool = prefill_pool()
    workers = 1 if pool is None else max(1, prefill_workers())
    # enough tasks for every worker (Gemma 3 270M has one KV head): split the rows, not the keys
    splits = max(1, min(t_rows // 16, -(-workers // kvh)))
    bounds = [t_rows * i // splits for i in range(splits + 1)]
    tasks = [(kh, a, b) for kh in range(kvh) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    args = (q, k_pool, v_pool, table, start, window, float(scale), float(softcap), group, products == "i16", out)
    if pool is None or len(tasks) == 1:
        for kh, a, b in tasks:
            _flash_task(kh, a, b, *args)
    else:
        for f in [pool.submit(_flash_task, kh, a, b, *args) for kh, a, b in tasks]:
            f.result()
    return out


def _flash_task(kh: int, a: int, b: int, q: np.ndarray, k_pool: np.ndarray, v_pool: np.ndarray, table: np.ndarray,
                start: int, window: int, scale: float, softcap: float, group: int, i16: bool, out: np.ndarray) -> None:
    """Query rows a..b-1 (positions start+a ..) of the `group` heads sharing KV head kh."""
    bt, dim = k_pool.shape[1], k_pool.shape[3]
    rows = b - a
    heads = slice(kh * group, (kh + 1) * group)
    qs = q[a:b, heads].reshape(rows * group, dim)  # vector m = (row m // group, head)
    # scaled once here, not every score (with a softcap the pass scales inside the tanh); a copy either way
    qs = qs * np.float32(scale) if softcap <= 0 else np.ascontiguousarray(qs)
    first_q, last_q = start + a, start + b - 1
    lo = 0 if window <= 0 else max(0, first_q - window + 1)
    lo -= lo % bt  # whole blocks; the softmax pass masks what the window hides
    m_run = np.full(rows * group, -np.inf, dtype=np.float32)
    l_run = np.zeros(rows * group, dtype=np.float32)
    acc = np.zeros((rows * group, dim), dtype=np.float32)
    if i16:
        _flash_task_i16(qs, k_pool, v_pool, table, kh, lo, first_q, last_q, group, window, scale, softcap, m_run,
                        l_run, acc)
        out[a:b, heads] = (acc / l_run[:, None]).reshape(rows, group, dim)
        return
    kbuf = np.empty((KEY_TILE, dim), dtype=np.float32)  # one tile of keys and of values, widened: reused
    vbuf = np.empty((KEY_TILE, dim), dtype=np.float32)
    for k0 in range(lo, last_q + 1, KEY_TILE):
        n = min(last_q + 1, k0 + KEY_TILE) - k0
        kt, vt = kbuf[:n], vbuf[:n]
        gather_rows(k_pool, table, kh, k0, kt)
        gather_rows(v_pool, table, kh, k0, vt)
        s = qs @ kt.T  # [rows * group, n]
        masked = k0 + n - 1 > first_q or (window > 0 and k0 <= last_q - window)
        _online_softmax(s, n, m_run, l_run, acc, k0, first_q, group, window, np.float32(scale), np.float32(softcap),
                        masked)
        acc += s @ vt
    out[a:b, heads] = (acc / l_run[:, None]).reshape(rows, group, dim)


@njit(nogil=True, error_model="numpy", cache=True)
def _flash_task_i16(qs, k_pool, v_pool, table, kh, lo, first_q, last_q, group, window, scale, softcap,
                    m_run, l_run, acc):  # type: ignore[no-untyped-def]  # pragma: no cover - numba
    """_flash_task's key loop with both products on int16 tiles (engine/kernels/i16tile.py): qs [M, D] the
    task's query vectors (scaled unless soft-capped), quantized once; per key tile, the keys become tiles
    of 16 keys, S = Q.K^T, the online softmax turns S into P in place, P is quantized per 32 keys and V^T
    becomes tiles of 16 values, and acc += P.V. m_run, l_run, acc as _online_softmax keeps them."""
    big_m, dim = qs.shape
    nbd = block_count(dim)
    xq = np.empty((big_m, nbd * QB), dtype=np.int16)
    dx = np.empty((big_m, nbd), dtype=np.float32)
    quantize_rows(qs, dim, xq, dx)
    kbuf = np.empty((KEY_TILE, dim), dtype=np.float32)
    vbuf = np.empty((KEY_TILE, dim), dtype=np.float32)
    kvals = np.empty((tile_count(KEY_TILE), nbd, TILE, TILE), dtype=np.int32)
    kscales = np.empty((tile_count(KEY_TILE), nbd, TILE), dtype=np.float32)
    nbk = block_count(KEY_TILE)
    ntd = tile_count(dim)
    vflat = np.empty(ntd * nbk * TILE * TILE, dtype=np.int32)  # V^T's tiles: [ntd, blocks of keys, ...]
    vsflat = np.empty(ntd * nbk * TILE, dtype=np.float32)
    sbuf = np.empty(big_m * KEY_TILE, dtype=np.float32)
    pq = np.empty(big_m * KEY_TILE, dtype=np.int16)
    pd = np.empty(big_m * nbk, dtype=np.float32)
    pv = np.empty((big_m, dim), dtype=np.float32)
    for k0 in range(lo, last_q + 1, KEY_TILE):
        n = min(last_q + 1, k0 + KEY_TILE) - k0
        nt, nb = tile_count(n), block_count(n)
        gather_rows(k_pool, table, kh, k0, kbuf[:n])
        build_tiles(kbuf[:n], kvals[:nt], kscales[:nt])
        s = sbuf[:big_m * nb * QB].reshape((big_m, nb * QB))  # the keys padded to whole blocks (P of 0)
        tile_products(kvals[:nt], kscales[:nt], n, xq, dx, s)
        masked = k0 + n - 1 > first_q or (window > 0 and k0 <= last_q - window)
        _online_softmax(s, n, m_run, l_run, acc, k0, first_q, group, window, np.float32(scale),
                        np.float32(softcap), masked)
        p_q = pq[:big_m * nb * QB].reshape((big_m, nb * QB))
        p_d = pd[:big_m * nb].reshape((big_m, nb))
        quantize_rows(s, n, p_q, p_d)
        gather_rows(v_pool, table, kh, k0, vbuf[:n])
        vvals = vflat[:ntd * nb * TILE * TILE].reshape((ntd, nb, TILE, TILE))
        vscales = vsflat[:ntd * nb * TILE].reshape((ntd, nb, TILE))
        build_tiles_t(vbuf[:n], vvals, vscales)
        tile_products(vvals, vscales, dim, p_q, p_d, pv)
        acc += pv


@njit(nogil=True, error_model="numpy", cache=True)
def gather_rows(pool, table, kh, k0, out):  # type: ignore[no-untyped-def]  # pragma: no cover - numba
    """Positions k0 .. k0 + len(out) - 1 of KV head kh, found through the block table, widened to float32 into
    out [n, dim] (C-contiguous): what the tile's two BLAS products read. numpy's fancy indexing and astype did
    this at ~4 ns a value, a fifth of a 16k-position prefill's attention."""
    bt, dim = pool.shape[1], pool.shape[3]
    s0, s1, s2 = pool.strides[0], pool.strides[1], pool.strides[2]
    base, dst = pool.ctypes.data, out.ctypes.data
    for i in range(out.shape[0]):
        p = k0 + i
        src = base + np.uint64(table[p // bt] * s0 + (p % bt) * s1 + kh * s2)
        kv_get(pool, dst + np.uint64(i * dim * 4), src, dim)


# reassoc: the tile's max and sum vectorise (the products around this pass are BLAS, in BLAS's order anyway);
# no ninf: the running max starts at -inf
@njit(nogil=True, fastmath={"nnan", "nsz", "contract", "reassoc"}, error_model="numpy", cache=True)
def _online_softmax(s, n, m_run, l_run, acc, k0, first_q, group, window, scale, softcap, masked):  # type: ignore[no-untyped-def]  # pragma: no cover - numba
    """One key tile of the online softmax: s [M, >= n] scores of query vectors M (vector m is query position
    first_q + m // group) against keys k0..k0+n-1 (columns past n are left alone) become unnormalised
    probabilities in place; each row's
    running max m_run and sum l_run are updated and its accumulated P.V (acc) rescaled to the new max.
    Hidden keys (the future; past the sliding window) get probability 0. Indices are unsigned so the loops
    vectorise (no negative-index fix-up)."""
    big_m = s.shape[0]
    dim = acc.shape[1]
    base, stride = s.ctypes.data, s.strides[0]
    for m in range(big_m):
        row = s[m]
        qpos = first_q + m // group
        if softcap > 0.0:
            for j in range(np.uint64(n)):
                row[j] = softcap * np.tanh(row[j] * scale / softcap)
        hi = n
        lo = 0
        if masked:
            hi = min(n, max(0, qpos - k0 + 1))  # keys after the query are hidden
            if window > 0:
                lo = min(n, max(0, qpos - window + 1 - k0))  # keys at or before qpos - window too
        ulo, uhi = np.uint64(lo), np.uint64(hi)
        prev = m_run[m]
        mx = max_f32(base + np.uint64(m * stride + lo * 4), hi - lo)
        mx = prev if prev > mx else mx
        if mx == -np.inf:  # every key of this tile hidden and none seen yet
            row[:n] = 0.0
            continue
        tot = np.float32(0.0)
        for j in range(ulo, uhi):  # exp and sum in one pass
            e = _exp32(row[j] - mx)
            row[j] = e
            tot += e
        for j in range(np.uint64(0), ulo):
            row[j] = 0.0
        for j in range(uhi, np.uint64(n)):
            row[j] = 0.0
        alpha = _exp32(prev - mx) if prev > -np.inf else np.float32(0.0)
        l_run[m] = l_run[m] * alpha + tot
        m_run[m] = mx
        if alpha != 1.0:
            arow = acc[m]
            for d in range(np.uint64(dim)):
                arow[d] *= alpha


def reference_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int, window: int, scale: float,
                        softcap: float = 0.0) -> np.ndarray:
    """Slow obvious reference on contiguous K/V [L, KVH, D] (float64 internally), for tests."""
    t_rows, n_heads, _ = q.shape
    group = n_heads // k.shape[1]
    out = np.zeros(q.shape, dtype=np.float64)
    for t in range(t_rows):
        pos = start + t
        lo = max(0, pos - window + 1) if window > 0 else 0
        for h in range(n_heads):
            kk = k[lo : pos + 1, h // group].astype(np.float64)
            s = kk @ q[t, h].astype(np.float64) * scale
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            p = np.exp(s - s.max())
            p /= p.sum()
            out[t, h] = p @ v[lo : pos + 1, h // group].astype(np.float64)
    return out.astype(np.float32)
