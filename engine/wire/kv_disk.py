"""KV that survives a restart: full prefix-cache blocks kept on disk as KV frames (engine/wire/frame.py).

One file per block, named by a sha256 chain over the exact token prefix it ends, seeded by the model
identity, the pool layout and the share scope: a lookup can only ever find a file computed for those
very tokens, by this model, in this scope (a 64-bit chain hash, as the in-memory cache uses, would be
forgeable). Each file is a checksummed frame carrying identity, layout, the block's chain hash and
position and its descriptor; whatever fails to decode or does not match the lookup is refused, counted
and deleted, never loaded.

Writes go through one background thread (the loop thread only copies the block into a frame buffer): a
temp name, fsync, rename, so a half-written file is never read. The directory is bounded in bytes and
evicted least recently used (a read touches its file). A full disk or any write error turns
persistence off for the rest of the run with one warning; the engine goes on without it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.model.kv import BlockPool
from engine.wire.frame import Descriptor, Frame, FrameError, KVLayout, alloc_frame, decode_frame, seal_frame

LOG = logging.getLogger("fak.kv")
SUFFIX = ".kv"
MAX_PENDING_BYTES = 512 << 20  # frames queued for the writer; past this a block is simply not persisted


def default_dir(identity: bytes) -> Path:
    """~/.cache/fak/kv/<model identity> (the models' cache root, $XDG_CACHE_HOME honoured)."""
    from engine.gguf.aliases import cache_dir

    return cache_dir() / "kv" / identity.hex()[:32]


def default_bound(root: Path) -> int:
    """20 GiB, or a quarter of the free space where the cache lives, the smaller."""
    p = Path(root)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        free = shutil.disk_usage(p).free
    except OSError:
        free = 0
    return min(20 << 30, free // 4)


@dataclass(frozen=True)
class DiskStats:
    hits: int = 0  # blocks loaded from disk
    bytes_read: int = 0
    bytes_written: int = 0
    blocks_written: int = 0
    evictions: int = 0  # files removed to stay under the byte bound
    refused: int = 0  # files that failed a check (checksum, model, layout, scope, chain): deleted, not loaded
    dropped: int = 0  # blocks not persisted because the writer was behind
    files: int = 0
    disk_bytes: int = 0
    enabled: bool = True  # False after a write error (a full disk): no more persistence this run


class KVDiskCache:
    """The on-disk tier of the prefix cache for one model and pool layout."""

    def __init__(self, root: str | Path, identity: bytes, layout: KVLayout, max_bytes: int,
                 warn: Callable[[str], None] | None = None) -> None:
        self.dir = Path(root)
        self.identity, self.layout, self.max_bytes = identity, layout, int(max_bytes)
        self._warn = warn or LOG.warning
        self._seed = hashlib.sha256(b"fak-kv-disk\0" + identity + repr(layout).encode()).digest()
        self._index: OrderedDict[str, int] = OrderedDict()  # file name -> bytes, least recently used first
        self._lock = threading.Lock()  # the index and the counters: loop thread and writer thread
        self._c = dict.fromkeys(("hits", "bytes_read", "bytes_written", "blocks_written", "evictions", "refused",
                                 "dropped"), 0)
        self.enabled = True
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            entries = []
            for p in self.dir.iterdir():
                if p.name.endswith(".tmp"):  # a write cut short by a crash: never read, removed
                    p.unlink(missing_ok=True)
                elif p.name.endswith(SUFFIX):
                    st = p.stat()
                    entries.append((st.st_mtime_ns, p.name[: -len(SUFFIX)], st.st_size))
        except OSError as exc:
            self._disable(f"KV cache dir {self.dir} is not usable ({exc.strerror or exc}): no KV persistence")
            entries = []
        for _, name, size in sorted(entries):
            self._index[name] = size
        self._bytes = sum(self._index.values())  # what the index holds, kept as files come and go
        self._pending: deque[tuple[str, bytearray | memoryview]] = deque()
        self._pending_names: set[str] = set()
        self._pending_bytes = 0
        self._wake = threading.Condition(self._lock)
        self._closed = False
        self._writer = threading.Thread(target=self._write_loop, name="fak-kv-disk", daemon=True)
        self._writer.start()

    def fits(self, pool: BlockPool) -> bool:
        """The pool's blocks are the ones this cache stores (same layers, heads, head size, block, dtype)."""
        return hasattr(pool, "k") and KVLayout.of(pool) == self.layout

    # -- names
    def names(self, tokens: list[int], n_blocks: int, scope: str, start: int = 0, prev: bytes | None = None
              ) -> list[bytes]:
        """Digests naming blocks start..n_blocks-1 of `tokens` in `scope` (prev: block start-1's digest)."""
        bt = self.layout.block_tokens
        d = prev if prev is not None else hashlib.sha256(self._seed + scope.encode()).digest()
        out = []
        arr = np.asarray(tokens[start * bt : n_blocks * bt], dtype="<i8")
        for i in range(n_blocks - start):
            d = hashlib.sha256(d + arr[i * bt : (i + 1) * bt].tobytes()).digest()
            out.append(d)
        return out

    def has_files(self) -> bool:
        with self._lock:
            return bool(self._index)

    def has(self, digest: bytes) -> bool:
        with self._lock:
            return digest.hex() in self._index

    # -- write (loop thread: one copy into a frame buffer; the writer seals and stores it)
    def put(self, digest: bytes, chain_hash: int, position: int, desc: Any, pool: BlockPool, block: int) -> None:
        """Queue block `block` of `pool` (desc: the entry's KVDescriptor) to be written as `digest`."""
        name = digest.hex()
        with self._lock:
            if not self.enabled or self._closed or name in self._index or name in self._pending_names:
                return
            if self._pending_bytes >= MAX_PENDING_BYTES:
                self._c["dropped"] += 1
                return
        buf, k, v = alloc_frame(self.layout, self.identity, [chain_hash], [position], self.layout.block_tokens,
                               Descriptor(desc.scope, desc.taint, desc.verdict))
        k[:, 0] = pool.k[:, block]
        v[:, 0] = pool.v[:, block]
        with self._lock:
            self._pending.append((name, buf))
            self._pending_names.add(name)
            self._pending_bytes += len(buf)
            self._wake.notify()

    def _write_loop(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if not self._pending:
                    return
                name, buf = self._pending.popleft()
            try:
                if self.enabled:
                    self._store(name, seal_frame(buf))
            finally:
                with self._lock:
                    self._pending_bytes -= len(buf)
                    self._pending_names.discard(name)
                    self._wake.notify_all()

    def _store(self, name: str, buf: bytearray | memoryview) -> None:
        final = self.dir / (name + SUFFIX)
        tmp = self.dir / f"{name}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(buf)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            self._disable(f"KV cache dir {self.dir}: {exc.strerror or exc}: KV is no longer persisted this run")
            return
        with self._lock:
            self._index[name] = len(buf)
            self._bytes += len(buf)
            self._c["bytes_written"] += len(buf)
            self._c["blocks_written"] += 1
            victims = []
            while self._bytes > self.max_bytes and len(self._index) > 1:
                old, size = self._index.popitem(last=False)
                victims.append(old)
                self._bytes -= size
            self._c["evictions"] += len(victims)
        for old in victims:
            (self.dir / (old + SUFFIX)).unlink(missing_ok=True)

    def _disable(self, why: str) -> None:
        if self.enabled:
            self.enabled = False
            self._warn(f"fak: warning: {why}")

    # -- read (loop thread)
    def load(self, digest: bytes, chain_hash: int, position: int, scope: str) -> Frame | None:
        """The frame of the block named `digest`, checked against what the lookup expects; None if absent
        or refused (a refused file is counted and deleted)."""
        name = digest.hex()
        with self._lock:
            if name not in self._index:
                return None
        path = self.dir / (name + SUFFIX)
        try:
            data = path.read_bytes()
        except OSError:
            with self._lock:
                self._bytes -= self._index.pop(name, 0)
            return None
        try:
            f = decode_frame(data, self.identity, self.layout)
            if f.n_blocks != 1 or int(f.hashes[0]) != chain_hash or int(f.positions[0]) != position:
                raise FrameError("KV frame is for another block (chain hash or position differ)")
            if f.descriptor.scope != scope or f.descriptor.taint:
                raise FrameError("KV frame is for another scope (or tainted)")
            if f.last_fill != self.layout.block_tokens:
                raise FrameError("KV frame holds a partial block")
        except FrameError as exc:
            LOG.info("fak: KV cache file %s refused: %s", path, exc)
            with self._lock:
                self._c["refused"] += 1
                self._bytes -= self._index.pop(name, 0)
            path.unlink(missing_ok=True)
            return None
        with self._lock:
            self._c["hits"] += 1
            self._c["bytes_read"] += len(data)
            self._index.move_to_end(name)
        try:
            os.utime(path)  # LRU across restarts: the index is rebuilt from modification times
        except OSError:
            pass
        return f

    # -- life
    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every queued block is on disk (tests; close)."""
        with self._lock:
            self._wake.wait_for(lambda: not self._pending and self._pending_bytes == 0, timeout)

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        self._writer.join(timeout=5)

    def stats(self) -> DiskStats:
        with self._lock:
            return DiskStats(**self._c, files=len(self._index), disk_bytes=self._bytes,
                             enabled=self.enabled)
