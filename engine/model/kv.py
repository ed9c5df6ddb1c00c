"""Paged KV cache: a pool of fixed-size blocks (all layers at once), refcounted, and per-lane page tables.

A block holds `block_tokens` consecutive positions of K and V for every layer, so one block id
is the unit the scheduler budgets, shares (prefix reuse), swaps and frees.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from engine.errors import EngineError
from engine.kernels import kvtype


def physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # not on this platform: no ceiling
        return 1 << 62


class KVExhausted(EngineError):
    """No free block left in a fixed-size pool (the scheduler preempts on this)."""


class KVLost(EngineError):
    """The contents of a pool's blocks are gone (a pipeline stage restarted): every lane holding KV must be
    recomputed and the prefix cache emptied. Raised by a forward, before anything was advanced."""


class BlockPool:
    """K/V storage of shape [layers, blocks, block_tokens, kv_heads, head_dim], a free list and refcounts.

    `num_blocks=None` makes a growable pool (a standalone Session); a fixed pool raises KVExhausted.
    """

    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        num_blocks: int | None = None,
        block_tokens: int = 16,
        kv_dtype: str = "f32",
    ) -> None:
        if block_tokens <= 0:
            raise EngineError(f"block_tokens must be positive, got {block_tokens}")
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.block_tokens = block_tokens
        self.growable = num_blocks is None
        cap = 8 if num_blocks is None else int(num_blocks)
        shape = (n_layers, cap, block_tokens, n_kv_heads, head_dim)
        # Python ints: an absurd --kv-blocks / --block-tokens is a clear error, not a numpy ValueError or
        # MemoryError (or minutes building a free list of 10**20 ids)
        dtype = kvtype.storage(kv_dtype)  # f16 / bf16 held as their bits (engine/kernels/kvtype.py)
        nbytes = 2 * n_layers * cap * block_tokens * n_kv_heads * head_dim * dtype.itemsize
        if nbytes > physical_memory():
            raise EngineError(f"KV pool of {cap} blocks x {block_tokens} tokens needs {nbytes / 2**30:,.1f} GiB, "
                              f"more than this machine's {physical_memory() / 2**30:,.1f} GiB")
        try:
            self.k = np.zeros(shape, dtype=dtype)
            self.v = np.zeros(shape, dtype=dtype)
        except MemoryError:
            raise EngineError(f"KV pool of {cap} blocks x {block_tokens} tokens ({nbytes / 2**30:,.1f} GiB) "
                              "cannot be allocated") from None
        self.refcount = np.zeros(cap, dtype=np.int32)
        self._free: list[int] = list(range(cap - 1, -1, -1))  # pop() hands out low ids first

    @property
    def kv_dtype(self) -> str:
        """'f32', 'f16' or 'bf16': what the K/V values are stored as."""
        return kvtype.name_of(self.k.dtype)

    @property
    def capacity(self) -> int:
        return int(self.refcount.shape[0])

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.capacity - len(self._free)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block, K and V, all layers (what a swap moves per block)."""
        return 2 * self.n_layers * self.block_tokens * self.n_kv_heads * self.head_dim * self.k.itemsize

    # -- block contents as a whole (all layers): what swap and copy-on-write move. A pool whose layers live
    # elsewhere (a pipeline's, engine/pipeline/pipeline.py) overrides these three and keeps the allocator.
    def read_blocks(self, blocks: list[int]) -> bytes:
        """K then V of `blocks`, all layers, as host bytes."""
        ids = np.asarray(blocks, dtype=np.int64)
        return np.ascontiguousarray(self.k[:, ids]).tobytes() + np.ascontiguousarray(self.v[:, ids]).tobytes()

    def write_blocks(self, blocks: list[int], data: bytes) -> None:
        """Fill `blocks` from read_blocks() bytes."""
        n = len(blocks)
        ids = np.asarray(blocks, dtype=np.int64)
        shape = (self.n_layers, n, self.block_tokens, self.n_kv_heads, self.head_dim)
        half = len(data) // 2
        self.k[:, ids] = np.frombuffer(data, dtype=self.k.dtype, count=half // self.k.itemsize).reshape(shape)
        self.v[:, ids] = np.frombuffer(data, dtype=self.v.dtype, offset=half).reshape(shape)

    def copy_block(self, src: int, dst: int) -> None:
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]

    def _grow(self) -> None:
        old = self.capacity
        new = old * 2
        pad = ((0, 0), (0, new - old), (0, 0), (0, 0), (0, 0))
        self.k = np.pad(self.k, pad)
        self.v = np.pad(self.v, pad)
        self.refcount = np.concatenate([self.refcount, np.zeros(new - old, dtype=np.int32)])
        self._free = list(range(new - 1, old - 1, -1)) + self._free

    def allocate(self) -> int:
        """A fresh block with refcount 1."""
        if not self._free:
            if not self.growable:
                raise KVExhausted(f"KV pool exhausted ({self.capacity} blocks of {self.block_tokens} tokens)")
            self._grow()
        b = self._free.pop()
        self.refcount[b] = 1
        return b

    def incref(self, block: int) -> None:
        if self.refcount[block] <= 0:
            raise EngineError(f"incref of free KV block {block}")
        self.refcount[block] += 1

    def release(self, block: int) -> bool:
        """Drop one reference; True when the block became free."""
        if self.refcount[block] <= 0:
            raise EngineError(f"double free of KV block {block}")
        self.refcount[block] -= 1
        if self.refcount[block] == 0:
            self._free.append(block)
            return True
        return False


@dataclass
class PageTable:
    """One lane's view of the pool: the blocks that hold its positions 0..length-1, in order."""

    pool: BlockPool
    blocks: list[int] = field(default_factory=list)
    length: int = 0

    def blocks_needed(self, n_tokens: int) -> int:
        """Extra blocks this lane needs to hold `n_tokens` positions in all."""
        bt = self.pool.block_tokens
        return max(0, -(-n_tokens // bt) - len(self.blocks))

    def reserve(self, n_tokens: int) -> None:
        """Make room for positions up to n_tokens-1 (allocates blocks; may raise KVExhausted)."""
        for _ in range(self.blocks_needed(n_tokens)):
            self.blocks.append(self.pool.allocate())

    def write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store k, v ([T, kv_heads, head_dim]) at positions start..start+T-1 (already reserved)."""
        bt = self.pool.block_tokens
        t, end = 0, start + k.shape[0]
        pos = start
        while pos < end:
            b, off = self.blocks[pos // bt], pos % bt
            n = min(bt - off, end - pos)
            self.pool.k[layer, b, off : off + n] = kvtype.encode(k[t : t + n], self.pool.k.dtype)
            self.pool.v[layer, b, off : off + n] = kvtype.encode(v[t : t + n], self.pool.v.dtype)
            pos += n
            t += n

    def gather(self, layer: int, n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V of positions 0..n_tokens-1 as contiguous float32 [n_tokens, kv_heads, head_dim] arrays."""
        nb = -(-n_tokens // self.pool.block_tokens)
        ids = self.blocks[:nb]
        shape = (nb * self.pool.block_tokens, self.pool.n_kv_heads, self.pool.head_dim)
        k = kvtype.decode(self.pool.k[layer, ids].reshape(shape)[:n_tokens])
        v = kvtype.decode(self.pool.v[layer, ids].reshape(shape)[:n_tokens])
        return k, v

    def truncate(self, n_tokens: int) -> None:
        """Positions 0..n_tokens-1 only: the blocks past the ones they need go back to the pool."""
        keep = -(-n_tokens // self.pool.block_tokens)
        for b in self.blocks[keep:]:
            self.pool.release(b)
        del self.blocks[keep:]
        self.length = n_tokens

    def free(self) -> None:
        """Release every block (shared blocks stay alive for their other owners)."""
        for b in self.blocks:
            self.pool.release(b)
        self.blocks = []
        self.length = 0


def export_blocks(pool: BlockPool, blocks: list[int]) -> bytes:
    """K then V of `blocks` (all layers) as host bytes: what a swap-out moves off the pool."""
    return pool.read_blocks(blocks)


def import_blocks(pool: BlockPool, data: bytes) -> list[int]:
    """Allocate fresh blocks and fill them from `export_blocks` bytes (swap-in); all or nothing."""
    per_block = pool.block_bytes
    if per_block == 0 or len(data) % per_block:
        raise EngineError(f"swap payload of {len(data)} bytes is not a whole number of {per_block}-byte KV blocks")
    n = len(data) // per_block
    if not pool.growable and pool.num_free < n:
        raise KVExhausted(f"KV pool has {pool.num_free} free blocks, swap-in needs {n}")
    blocks = [pool.allocate() for _ in range(n)]
    pool.write_blocks(blocks, data)
    return blocks
