"""Prefix cache: full KV blocks keyed by a chained hash of their token ids (vLLM's automatic prefix caching).

The cache holds one reference on every block it knows. A block whose only reference is the cache's is
"reclaimable": it counts as used in the pool but is evicted LRU when the scheduler needs room.
Blocks are only ever full and never written again (lanes append past them), so sharing is safe.

Trust (engine/sched/trust.py): every entry carries the KVDescriptor of the lane that computed it.
Hashes are seeded by the scope and a lookup matches only entries of its own scope, so scopes never
share blocks (the public scope "" hashes exactly as an unscoped cache did); a tainted span is never
inserted, so it is never a hit for anyone.

Disk (engine/wire/kv_disk.py, given by whoever builds the scheduler): every block the cache takes is
also written to disk, and `restore` brings back the blocks of a prompt that memory no longer (or never)
held, before the scheduler looks the prompt up: a restarted process starts where the last one stopped.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.errors import EngineError
from engine.model.kv import BlockPool, physical_memory
from engine.sched.lane import Lane
from engine.sched.trust import PUBLIC, UNSCOPED, KVDescriptor, scope_seed


def chain_hashes(tokens: list[int], block_tokens: int, n_blocks: int, scope: str = PUBLIC) -> list[int]:
    """hash of block i covers tokens of blocks 0..i (each hash folds in its parent's; block 0's parent is
    the scope's seed, so the same tokens hash differently in two scopes)."""
    out: list[int] = []
    h = scope_seed(scope)
    for i in range(n_blocks):
        h = hash((h, tuple(tokens[i * block_tokens : (i + 1) * block_tokens])))
        out.append(h)
    return out


@dataclass
class _Entry:
    block: int
    tokens: tuple[int, ...]  # kept to rule out hash collisions
    parent: int
    desc: KVDescriptor = UNSCOPED
    hits: int = 0
    disk: bytes | None = None  # the block's name on disk (a digest of its whole token prefix), with a disk tier
    rows: bool = False  # filled by the row-stable kernels (a prompt's last partial chunk, decode rows), not BLAS


class PrefixCache:
    def __init__(self, pool: BlockPool, disk: Any = None) -> None:
        self.pool = pool
        self.disk = disk  # an engine.wire.kv_disk.KVDiskCache (sched sits below wire: given, not imported)
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # hash -> entry, LRU first
        self._by_block: dict[int, int] = {}  # block id -> hash
        # residency events ("add" | "evict", chain hashes), on the owner's thread: a P/D router's view
        self.listener: Callable[[str, list[int]], None] | None = None
        self.queries = 0
        self.hits = 0  # queries that mapped at least one block
        self.hit_tokens = 0
        self.evictions = 0
        self.tainted_refused = 0  # offers of tainted spans (each prefill chunk, each finish) not kept

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, tokens: list[int], max_tokens: int, align: int = 1, scope: str = PUBLIC,
              tail: int | None = None) -> list[int]:
        """Blocks caching the longest full-block prefix of tokens[:max_tokens] in `scope`, a multiple of
        `align` blocks long, or past it into the prompt's row-stable tail from block `tail` on (`row_tail`);
        each is incref'd for the caller."""
        bt = self.pool.block_tokens
        self.queries += 1
        blocks = [e.block for e in self._cached_run(tokens, max_tokens, align, scope, tail)]
        for b in reversed(blocks):  # touch leaf first so parents stay more recent (LRU evicts leaves first)
            h = self._by_block[b]
            self._entries[h].hits += 1
            self._entries.move_to_end(h)
            self.pool.incref(b)
        if blocks:
            self.hits += 1
            self.hit_tokens += len(blocks) * bt
        return blocks

    def peek(self, tokens: list[int], max_tokens: int, align: int = 1, scope: str = PUBLIC,
             tail: int | None = None) -> tuple[int, int]:
        """(blocks `match` would map now, how many of them are reclaimable): no incref, no stats."""
        run = self._cached_run(tokens, max_tokens, align, scope, tail)
        return len(run), sum(1 for e in run if self.pool.refcount[e.block] == 1)

    def _cached_run(self, tokens: list[int], max_tokens: int, align: int, scope: str,
                    tail: int | None = None) -> list[_Entry]:
        """Entries of the longest cached full-block prefix of tokens[:max_tokens] in `scope`, cut to a
        multiple of `align` blocks (each entry checked against its parent, its own tokens and its scope:
        neither a hash collision nor a seed collision maps another's block). A cut that reaches block
        `tail` (where the prompt's last, partial chunk starts) runs on through the entries the row-stable
        kernels filled: this prompt computes those positions with the same kernels, so the bits are the
        ones it would compute (a BLAS-filled block there, from a longer prompt, would not be)."""
        bt = self.pool.block_tokens
        run: list[_Entry] = []
        parent = scope_seed(scope)
        for h in chain_hashes(tokens, bt, max_tokens // bt, scope):
            e = self._entries.get(h)
            i = len(run)
            if e is None or e.parent != parent or e.desc.scope != scope or \
                    e.tokens != tuple(tokens[i * bt : (i + 1) * bt]):
                break
            run.append(e)
            parent = h
        cut = len(run) - len(run) % align
        if cut == tail:
            while cut < len(run) and run[cut].rows:
                cut += 1
        return run[:cut]

    def insert(self, tokens: list[int], blocks: list[int], n_full: int, desc: KVDescriptor = UNSCOPED,
               rows_from: int | None = None) -> None:
        """Offer the first n_full full blocks of a lane (its prompt's after prefill, prompt + generated
        when it finishes) under its descriptor, blocks from `rows_from` on marked as filled by the
        row-stable kernels (None: none, or not known); already-cached prefixes are kept, a tainted span
        is refused whole. Where the cache holds one of the lane's blocks filled the other way, BLAS wins:
        a row-stable block (a short prompt's tail) gives way to the lane's BLAS one, which every longer
        prompt computes; a lane's row-stable block under a cached BLAS one ends the offer (its later blocks
        were computed over its own bits: chained under the cached block, a hit would map a prefix no run
        computed)."""
        if desc.taint:
            self.tainted_refused += n_full > 0
            return
        bt = self.pool.block_tokens
        parent = scope_seed(desc.scope)
        hashes = chain_hashes(tokens, bt, n_full, desc.scope)
        added: list[int] = []
        name: bytes | None = None  # the previous block's disk name
        for i, h in enumerate(hashes):
            e = self._entries.get(h)
            rows = rows_from is not None and i >= rows_from
            if e is not None and e.block != blocks[i] and e.rows != rows:
                if rows or blocks[i] in self._by_block:
                    break
                self._repoint(h, e, blocks[i])
            if self.disk is not None:
                name = e.disk if e is not None and e.disk is not None else \
                    self.disk.next_name(name, desc.scope, tokens[i * bt : (i + 1) * bt])
            if e is None and blocks[i] not in self._by_block:
                self._entries[h] = _Entry(blocks[i], tuple(tokens[i * bt : (i + 1) * bt]), parent, desc, disk=name,
                                          rows=rows)
                self._by_block[blocks[i]] = h
                self.pool.incref(blocks[i])
                added.append(h)
                if self.disk is not None and name is not None:
                    self.disk.put(name, h, i * bt, desc, self.pool, blocks[i])
            parent = h
        if added and self.listener is not None:
            self.listener("add", added)
        for h in reversed(hashes):
            if h in self._entries:
                self._entries.move_to_end(h)

    def _repoint(self, h: int, e: _Entry, block: int) -> None:
        """Entry h holds `block` (filled through BLAS) instead of its row-stable one: lanes holding the old
        block keep it, the cache's reference moves. (A disk copy keeps the old bits: a restore maps whole
        chunks only, where a reply's decode-filled blocks already differ in the last bits.)"""
        del self._by_block[e.block]
        self.pool.release(e.block)
        e.block, e.rows = block, False
        self._by_block[block] = h
        self.pool.incref(block)

    def restore(self, tokens: list[int], max_tokens: int, align: int = 1, scope: str = PUBLIC) -> int:
        """Load from disk the full-block prefix of tokens[:max_tokens] in `scope` that memory lacks, up to
        the first block disk lacks too (or a full fixed pool), within the whole multiples of `align` blocks
        a match may map; the blocks join the cache as reclaimable entries, most recent. Returns the blocks
        loaded."""
        if self.disk is None or not self.disk.has_files():
            return 0
        bt = self.pool.block_tokens
        parent = scope_seed(scope)
        name: bytes | None = None
        added: list[int] = []
        for i, h in enumerate(chain_hashes(tokens, bt, max_tokens // bt // align * align, scope)):
            own = tuple(tokens[i * bt : (i + 1) * bt])
            e = self._entries.get(h)
            if e is not None:
                if e.parent != parent or e.desc.scope != scope or e.tokens != own:
                    break  # a collision: match() would stop here too
                self._entries.move_to_end(h)  # keep this prompt's resident blocks from being evicted below
                name = e.disk or self.disk.next_name(name, scope, own)
                parent = h
                continue
            name = self.disk.next_name(name, scope, own)
            if not self.disk.has(name):
                break
            if not self.pool.growable and self.pool.num_free == 0 and self.evict(1) == 0:
                break
            frame = self.disk.load(name, h, i * bt, scope)
            if frame is None:
                break
            b = self.pool.allocate()  # its one reference is the cache's: reclaimable at once
            self.pool.k[:, b] = frame.k[:, 0]
            self.pool.v[:, b] = frame.v[:, 0]
            self._entries[h] = _Entry(b, own, parent, KVDescriptor(scope, False, frame.descriptor.verdict), disk=name)
            self._by_block[b] = h
            added.append(h)
            parent = h
        if added and self.listener is not None:
            self.listener("add", added)
        return len(added)

    def descriptor(self, block: int) -> KVDescriptor | None:
        """The descriptor of a cached block (None: not cached), e.g. for a KV transfer frame."""
        h = self._by_block.get(block)
        return None if h is None else self._entries[h].desc

    def block_hits(self, block: int) -> int:
        h = self._by_block.get(block)
        return 0 if h is None else self._entries[h].hits

    def reclaimable(self) -> int:
        return sum(1 for e in self._entries.values() if self.pool.refcount[e.block] == 1)

    def trim(self, max_blocks: int) -> int:
        """Evict least recently used cache-only blocks until at most max_blocks are cached (or none is left
        to evict); returns how many were freed."""
        return self.evict(len(self._entries) - max_blocks) if len(self._entries) > max_blocks else 0

    def evict(self, n: int) -> int:
        """Free up to n cache-only blocks, least recently used first; returns how many were freed."""
        freed = 0
        for h in [h for h, e in self._entries.items() if self.pool.refcount[e.block] == 1]:
            if freed >= n:
                break
            self._drop(h)
            freed += 1
        self.evictions += freed
        return freed

    def _drop(self, h: int) -> None:
        e = self._entries.pop(h)
        del self._by_block[e.block]
        self.pool.release(e.block)
        if self.listener is not None:
            self.listener("evict", [h])

    def clear(self) -> None:
        """Release every cached block (on scheduler close)."""
        for h in list(self._entries):
            self._drop(h)


def default_cache_bytes() -> int:
    """A quarter of the machine's memory (6 GiB on a 24 GiB machine): an agent's 16k-token context is
    0.2-0.3 GB of f16 K/V on the packaged models (twice that in f32), so twenty or more of them."""
    return min(physical_memory(), 1 << 62) // 4


def cache_blocks(pool: BlockPool, nbytes: int | None) -> int:
    """The blocks of `pool` a prefix cache of `nbytes` (None: default_cache_bytes) may keep."""
    if nbytes is None:
        nbytes = default_cache_bytes()
    if nbytes < 0:
        raise EngineError(f"prefix cache size must be >= 0 bytes, got {nbytes}")
    return nbytes // max(1, pool.block_bytes)


# -- the scheduler's side of sharing: which blocks a lane's prompt may map, and when to wait for them


def hit_limit(lane: Lane) -> int:
    """Prompt tokens a prefix hit may cover: all but the last (its logits give the first token)."""
    return len(lane.prompt_ids) - 1


def prompt_hashes(lane: Lane, block_tokens: int) -> list[int]:
    """Chained hashes of the lane's full prompt blocks (the ones the prefix cache may hold), computed once."""
    if lane.prompt_hashes is None:
        lane.prompt_hashes = chain_hashes(lane.prompt_ids, block_tokens, hit_limit(lane) // block_tokens,
                                          lane.request.scope)
    return lane.prompt_hashes


def row_tail(lane: Lane, align: int, chunk: int) -> int | None:
    """The block where the lane's prompt's last, partial prefill chunk starts (None when hits need no
    alignment, `align` 1): full chunks run through BLAS, that tail through the row-stable kernels, so a
    hit may run past whole chunks into it only through blocks the row-stable kernels filled. A prompt that
    is whole chunks has no partial chunk: its tail block lies past every block a hit may map."""
    return None if align == 1 else len(lane.prompt_ids) // chunk * align


def waits_for_producer(cache: PrefixCache, lane: Lane, producing: set[int], align: int,
                       tail: int | None = None) -> bool:
    """In one batched forward, lanes cannot share what none has computed yet: a newcomer whose next
    uncached prompt block is being filled by another lane this iteration waits, then maps it from the
    prefix cache instead of computing it again."""
    hashes = prompt_hashes(lane, cache.pool.block_tokens)
    hit = cache.peek(lane.prompt_ids, hit_limit(lane), align, lane.request.scope, tail)[0]
    return hit < len(hashes) and hashes[hit] in producing


def shareable_blocks(ids: list[int], block_tokens: int) -> int:
    """Leading prompt blocks a decode worker may supply: full ones, never the one holding the last token
    (its logits come from the prefill, so at least that block is always computed and moved)."""
    return (len(ids) - 1) // block_tokens
