"""Shared-memory transport: a single-producer single-consumer ring of frames in one shared segment.

The receiver creates the segment (and unlinks it on close); the sender attaches by name. A frame is one
contiguous record in the ring, so the receiver reads it in place: `recv` returns a view into the segment
that stays valid until the next `recv` (only then does the sender get that room back). Nothing is pickled;
the sender's one copy is into the ring, the receiver's is from the ring into its pool.

Segment: a control area (head, tail and the two closed flags, each on its own cache line) and `capacity`
bytes of records. A record is a 16-byte header (length) and the frame, padded to 64 bytes; a record that
would run past the end leaves a wrap marker and starts at offset 0. head/tail count bytes ever written /
released, so head - tail is the room in use. Each is written by one side only, with one aligned 8-byte
store issued after the payload's copy has returned (x86 keeps stores in order; on weaker memory models
the sender's head store would need a fence); the other side polls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from multiprocessing import shared_memory

import numpy as np

from engine.wire.transport import (
    Buffer,
    TransportClosed,
    TransportError,
    TransportTimeout,
)

_CTL = 512  # control area bytes; data starts here
_HEAD, _TAIL, _SENDER_CLOSED, _RECEIVER_CLOSED, _CAPACITY = 0, 8, 16, 24, 32  # u64 slots (x8 bytes = 64 B apart)
_REC = 16
_ALIGN = 64
_WRAP = np.uint64(0xFFFF_FFFF_FFFF_FFFF)


def _pad(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _wait(ready: Callable[[], bool], timeout: float | None, what: str) -> None:
    """Poll `ready`: spin a little (a frame usually arrives within microseconds), then back off to 1 ms sleeps."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.0
    while not ready():
        if deadline is not None and time.monotonic() > deadline:
            raise TransportTimeout(f"shm transport: {what} within {timeout} s")
        time.sleep(delay)
        delay = min(0.001, delay * 2 or 1e-6)


_TRACK_LOCK = threading.Lock()


def _attach(name: str) -> shared_memory.SharedMemory:
    """Attach to a ring without registering it with this process's resource tracker: Python < 3.13 registers
    every attach, and the tracker then unlinks the segment when this process exits, under the receiver that
    created it (which stays its one owner: its tracker cleans up even after a SIGKILL)."""
    from multiprocessing import resource_tracker

    with _TRACK_LOCK:
        register = resource_tracker.register
        resource_tracker.register = lambda *a, **k: None  # type: ignore[assignment]
        try:
            return shared_memory.SharedMemory(name=name, create=False)
        finally:
            resource_tracker.register = register  # type: ignore[assignment]


class _Ring:
    def __init__(self, shm: shared_memory.SharedMemory) -> None:
        self.shm = shm
        self.ctl = np.ndarray((_CTL // 8,), dtype=np.uint64, buffer=shm.buf)
        self.data = shm.buf[_CTL:]

    @property
    def capacity(self) -> int:
        return int(self.ctl[_CAPACITY])

    def get(self, slot: int) -> int:
        return int(self.ctl[slot])

    def set(self, slot: int, value: int) -> None:
        self.ctl[slot] = value

    def close(self) -> None:
        """Unmap; if a caller still holds arrays over a frame the mapping stays until they go (no crash)."""
        self.ctl = None  # type: ignore[assignment]
        try:
            self.data.release()
            self.shm.close()
        except BufferError:
            pass


class ShmReceiver:
    """Creates the ring; pass `.name` to the sender (another process)."""

    def __init__(self, capacity: int = 64 << 20, name: str | None = None) -> None:
        capacity = _pad(capacity)
        with _TRACK_LOCK:  # not while an attach has the tracker's register switched off
            self._shm = shared_memory.SharedMemory(name=name, create=True, size=_CTL + capacity)
        self._ring = _Ring(self._shm)
        self._ring.ctl[:] = 0
        self._ring.set(_CAPACITY, capacity)
        self._pending = 0  # bytes to release at the next recv (the record last handed out)
        self._view: memoryview | None = None
        self._closed = False

    @property
    def name(self) -> str:
        return self._shm.name

    @property
    def capacity(self) -> int:
        return self._ring.capacity

    def recv(self, timeout: float | None = None) -> memoryview:
        if self._closed:
            raise TransportClosed("shm transport: receiver already closed")
        r = self._ring
        if self._view is not None:
            try:
                self._view.release()
            except BufferError:  # arrays over the last frame still exist: their bytes are reused now anyway
                pass
            self._view = None
        tail = r.get(_TAIL) + self._pending
        self._pending = 0
        r.set(_TAIL, tail)  # the previous frame's room goes back to the sender
        cap = r.capacity
        while True:
            def ready(tail: int = tail) -> bool:
                if r.get(_HEAD) > tail:
                    return True
                if r.get(_SENDER_CLOSED):
                    raise TransportClosed("shm transport: the sender closed its end")
                return False

            _wait(ready, timeout, "no frame")
            off = tail % cap
            length = int(np.frombuffer(r.data, dtype=np.uint64, count=1, offset=off)[0])
            if length == int(_WRAP):
                tail += cap - off
                r.set(_TAIL, tail)
                continue
            self._pending = _pad(_REC + length)
            self._view = r.data[off + _REC : off + _REC + length]
            return self._view

    def reset(self) -> None:
        """Take a new sender (the last one went away): unread records are dropped, the closed flag cleared.
        Only while nobody is in recv() on this ring."""
        if self._view is not None:
            try:
                self._view.release()
            except BufferError:
                pass
            self._view = None
        self._pending = 0
        self._ring.set(_TAIL, self._ring.get(_HEAD))
        self._ring.set(_SENDER_CLOSED, 0)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._view is not None:
            try:
                self._view.release()
            except BufferError:  # the caller still has arrays over the last frame
                pass
        self._ring.set(_RECEIVER_CLOSED, 1)
        self._ring.close()
        self._shm.unlink()


class ShmSender:
    """Attaches to a receiver's ring by name."""

    def __init__(self, name: str) -> None:
        try:
            self._shm = _attach(name)
        except FileNotFoundError:
            raise TransportClosed(f"shm transport: no ring named {name!r} (the receiver is gone)") from None
        self._ring = _Ring(self._shm)
        self._closed = False

    def send(self, frame: Buffer, timeout: float | None = None) -> None:
        if self._closed:
            raise TransportClosed("shm transport: sender already closed")
        r = self._ring
        src = memoryview(frame).cast("B")
        n, cap = len(src), r.capacity
        need = _pad(_REC + n)
        if need > cap:
            raise TransportError(f"shm transport: a frame of {n} bytes does not fit a ring of {cap} bytes")
        head = r.get(_HEAD)
        off = head % cap
        skip = cap - off if off + need > cap else 0  # the record must be contiguous: wrap to offset 0

        def room() -> bool:
            if r.get(_RECEIVER_CLOSED):
                raise TransportClosed("shm transport: the receiver closed its end")
            return cap - (head - r.get(_TAIL)) >= skip + need

        _wait(room, timeout, f"no room for a {n}-byte frame")
        if skip:
            np.frombuffer(r.data, dtype=np.uint64, count=1, offset=off)[0] = _WRAP
            head, off = head + skip, 0
        np.frombuffer(r.data, dtype=np.uint64, count=2, offset=off)[:] = (n, 0)
        r.data[off + _REC : off + _REC + n] = src  # one memcpy into the ring
        r.set(_HEAD, head + need)  # publish after the payload

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._ring.set(_SENDER_CLOSED, 1)
        self._ring.close()
