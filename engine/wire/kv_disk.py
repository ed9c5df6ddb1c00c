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
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.model.kv import BlockPool
from engine.wire.frame import Descriptor, Frame, FrameError, KVLayout, alloc_frame, decode_frame, seal_frame

LOG = logging.getLogger("fak.kv")
SUFFIX = ".kv"
MAX_PENDING_BYTES = 512 << 20  # frames queued for the writer; past this a block is simply not persisted


def model_dir(identity: bytes, root: str | Path | None = None) -> Path:
    """<root>/<model identity>, root defaulting to ~/.cache/fak/kv (the models' cache root, $XDG_CACHE_HOME
    honoured): one directory per model, so two models never share a directory."""
    if root is None:
        from engine.gguf.aliases import cache_dir

        root = cache_dir() / "kv"
    return Path(root).expanduser() / identity.hex()[:32]


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


def _background() -> None:
    """The writer thread yields the CPU to the model's: on two cores, a 16k-token prompt's 400 MB of frames
    (copied, checksummed, written) took decode after it from 13.3 to 11.0 tok/s at equal priority."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # Linux: a thread's own nice value
    except (AttributeError, OSError):
        pass


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
        self._pending_names: set[str] = set()  # queued for the writer, not yet on disk
        self._pending_bytes = 0
        self._idle = threading.Condition(self._lock)  # notified as each queued block is done
        self._closed = False
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fak-kv-disk", initializer=_background)

    def fits(self, pool: BlockPool) -> bool:
        """The pool's blocks are the ones this cache stores (same layers, heads, head size, block, dtype)."""
        return hasattr(pool, "k") and KVLayout.of(pool) == self.layout

    # -- names
    def next_name(self, prev: bytes | None, scope: str, block: list[int]) -> bytes:
        """The name of the block holding `block` (its token ids) after the block named `prev` (None: the
        first block) in `scope`: each name folds in the one before, so it covers the whole prefix."""
        d = prev if prev is not None else hashlib.sha256(self._seed + scope.encode()).digest()
        return hashlib.sha256(d + np.asarray(block, dtype="<i8").tobytes()).digest()

    def names(self, tokens: list[int], n_blocks: int, scope: str) -> list[bytes]:
        """The names of blocks 0..n_blocks-1 of `tokens` in `scope`."""
        bt = self.layout.block_tokens
        out: list[bytes] = []
        for i in range(n_blocks):
            out.append(self.next_name(out[-1] if out else None, scope, tokens[i * bt : (i + 1) * bt]))
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
            if self._closed:  # closed while the block was copied
                return
            self._pending_names.add(name)
            self._pending_bytes += len(buf)
            self._writer.submit(self._write, name, buf)  # under the lock: close() cannot shut it down between

    def _write(self, name: str, buf: bytearray | memoryview) -> None:
        """The writer thread's job for one queued block: seal (the checksum) and store it."""
        try:
            if self.enabled:
                self._store(name, seal_frame(buf))
        finally:
            with self._lock:
                self._pending_bytes -= len(buf)
                self._pending_names.discard(name)
                self._idle.notify_all()

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
            self._idle.wait_for(lambda: not self._pending_names, timeout)

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._closed = True
        self._writer.shutdown(wait=True)

    def stats(self) -> DiskStats:
        with self._lock:
            return DiskStats(**self._c, files=len(self._index), disk_bytes=self._bytes,
                             enabled=self.enabled)
