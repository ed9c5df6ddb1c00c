"""Export KV blocks of a BlockPool into a transfer frame, and import a frame's blocks into another pool.

Both sides move whole blocks with numpy (one gather into the frame, one scatter out of it): no Python
runs per element or per token. Import validates the whole frame first, then allocates and writes, so a
bad frame leaves the receiving pool exactly as it was.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.model.kv import BlockPool, KVExhausted
from engine.wire.frame import (
    Descriptor,
    FrameError,
    KVLayout,
    alloc_frame,
    decode_frame,
    seal_frame,
)


def export_blocks(pool: BlockPool, block_ids: Sequence[int], hashes: Sequence[int], positions: Sequence[int],
                  descriptor: Descriptor, identity: bytes, last_fill: int | None = None,
                  key: bytes = b"", out: bytearray | None = None) -> bytearray | memoryview:
    """A frame holding the K/V of `block_ids` (in order), their chain hashes and first positions.

    `last_fill` is how many positions of the last block are filled (default: all of them; a lane's tail
    block is usually partial). `out`: a reusable buffer to build the frame in (see alloc_frame)."""
    n = len(block_ids)
    if len(hashes) != n or len(positions) != n:
        raise FrameError(f"export of {n} blocks with {len(hashes)} hashes and {len(positions)} positions")
    ids = np.asarray(block_ids, dtype=np.int64)
    if n and (ids.min() < 0 or ids.max() >= pool.capacity or (pool.refcount[ids] <= 0).any()):
        raise FrameError(f"export of blocks {list(block_ids)[:8]}: not all are live blocks of this pool")
    layout = KVLayout.of(pool)
    buf, k, v = alloc_frame(layout, identity, hashes, positions,
                            pool.block_tokens if last_fill is None else last_fill, descriptor, key, out)
    for src, dst, n_run in _runs(ids):  # gathered straight into the frame: the only copy on this side
        k[:, dst : dst + n_run] = pool.k[:, src : src + n_run]
        v[:, dst : dst + n_run] = pool.v[:, src : src + n_run]
    return seal_frame(buf)


def import_blocks(pool: BlockPool, frame: bytes | bytearray | memoryview, identity: bytes,
                  key: bytes = b"") -> list[int]:
    """Validate `frame` for this pool and model, allocate one fresh block (refcount 1) per carried block and
    write its K/V in place; returns the new block ids in frame order. All or nothing."""
    f = decode_frame(frame, identity, KVLayout.of(pool), key)
    n = f.n_blocks
    if not pool.growable and pool.num_free < n:
        raise KVExhausted(f"KV pool has {pool.num_free} free blocks, the frame carries {n}")
    blocks = [pool.allocate() for _ in range(n)]  # before writing: a growable pool may reallocate k/v here
    write_kv = getattr(pool, "write_kv", None)
    if write_kv is not None:  # a pipeline's pool: the layers live on its stages (engine/pipeline/pipeline.py)
        try:
            write_kv(blocks, f.k, f.v)
        except BaseException:
            for b in blocks:
                pool.release(b)
            raise
        return blocks
    for dst, src, n_run in _runs(np.asarray(blocks, dtype=np.int64)):
        pool.k[:, dst : dst + n_run] = f.k[:, src : src + n_run]
        pool.v[:, dst : dst + n_run] = f.v[:, src : src + n_run]
    return blocks


def _runs(ids: np.ndarray) -> list[tuple[int, int, int]]:
    """(pool block, frame index, length) of each run of consecutive pool ids.

    Slice copies of whole runs go at memcpy speed (~6.5 GB/s here); a fancy-indexed gather or scatter
    (np.take, pool.k[:, ids]) runs at ~1.4. Fresh allocations are mostly consecutive, so runs are few;
    the worst case is one slice copy per block (layers x block_tokens x heads x dim elements each)."""
    if ids.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [ids.size]))
    return [(int(ids[a]), int(a), int(b - a)) for a, b in zip(starts, ends, strict=False)]
