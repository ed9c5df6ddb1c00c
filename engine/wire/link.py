"""Links: a JSON header and blobs, in order, one way, over a queue, a shared-memory ring or a TCP channel.

A ring record is a 4-byte header length, the JSON header padded with spaces so what follows starts
aligned, then the payload (`_record` / `_split`, shared by both kinds of link below).

Stage links (pipeline stages): a header and one blob (hidden rows).

    QueueLink    in one process (threads): the reference, a queue of (header, copy of the blob)
    RingLink     one host: a shared-memory ring (engine/wire/shm.py), header and blob in one record
    ChannelLink  across hosts: a TCP Channel (engine/wire/channel.py), the blob read with recv_into

`recv` returns the blob as a memoryview valid until the next `recv` on that link.

Data links (P/D): how a prefill worker process hands a prefilled prompt to a decode worker process. One
delivery is a small JSON header (the request, its prompt ids, the blocks the decode worker reserved), the
last position's logits, and the KV frame. Two kinds, chosen per link:

    tcp  one Channel message with two blobs (across hosts; recv_into preallocated buffers)
    shm  two records in the decode worker's shared-memory ring (same host): header + logits, then the
         frame, which the decode worker imports straight from the ring (no socket, no pickling)

Deliveries on one link arrive in the order sent; each link has one sender.
"""

from __future__ import annotations

import json
import queue
import struct
from typing import Any, Protocol

import numpy as np

from engine.wire.channel import Channel
from engine.wire.shm import ShmReceiver, ShmSender
from engine.wire.transport import TransportClosed, TransportTimeout

_HLEN = struct.Struct("<I")


class Link(Protocol):
    def send(self, header: dict[str, Any], blob: Any) -> None: ...

    def recv(self, timeout: float | None = None) -> tuple[dict[str, Any], memoryview]: ...

    def close(self) -> None: ...


_CLOSED = object()


class QueueLink:
    def __init__(self) -> None:
        self.q: queue.Queue[Any] = queue.Queue()

    def send(self, header: dict[str, Any], blob: Any) -> None:
        self.q.put((header, bytes(memoryview(blob).cast("B"))))

    def recv(self, timeout: float | None = None) -> tuple[dict[str, Any], memoryview]:
        try:
            item = self.q.get(timeout=timeout)
        except queue.Empty:
            raise TransportTimeout(f"in-process link: nothing within {timeout} s") from None
        if item is _CLOSED:
            self.q.put(_CLOSED)
            raise TransportClosed("in-process link closed")
        return item[0], memoryview(item[1])

    def close(self) -> None:
        self.q.put(_CLOSED)


def _record(header: dict[str, Any], align: int) -> bytes:
    """A ring record's prefix: the header's length and the header, padded so the payload starts `align`-aligned."""
    text = json.dumps(header, separators=(",", ":")).encode()
    pad = -(_HLEN.size + len(text)) % align
    return _HLEN.pack(len(text) + pad) + text + b" " * pad


def _split(rec: memoryview) -> tuple[dict[str, Any], int]:
    """A ring record's header and where its payload starts."""
    (n,) = _HLEN.unpack_from(rec)
    return json.loads(bytes(rec[_HLEN.size : _HLEN.size + n])), _HLEN.size + n


class RingSender:
    def __init__(self, name: str) -> None:
        self.ring = ShmSender(name)

    def send(self, header: dict[str, Any], blob: Any) -> None:
        pre = _record(header, 8)  # the blob starts 8-byte aligned in the record
        self.ring.send(pre + memoryview(blob).cast("B").tobytes(), 60.0)  # hidden rows: KiB per decode step, one copy is nothing

    def recv(self, timeout: float | None = None) -> tuple[dict[str, Any], memoryview]:
        raise TransportClosed("a ring sender does not receive")

    def close(self) -> None:
        self.ring.close()


class RingReceiver:
    def __init__(self, capacity: int = 64 << 20) -> None:
        self.ring = ShmReceiver(capacity)

    @property
    def name(self) -> str:
        return self.ring.name

    def send(self, header: dict[str, Any], blob: Any) -> None:
        raise TransportClosed("a ring receiver does not send")

    def reset(self) -> None:
        self.ring.reset()

    def recv(self, timeout: float | None = None) -> tuple[dict[str, Any], memoryview]:
        rec = self.ring.recv(timeout)
        header, at = _split(rec)
        return header, rec[at:]

    def close(self) -> None:
        self.ring.close()


class ChannelLink:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def send(self, header: dict[str, Any], blob: Any) -> None:
        self.channel.send(header, blob)

    def recv(self, timeout: float | None = None) -> tuple[dict[str, Any], memoryview]:
        header, blobs = self.channel.recv(timeout)
        return header, blobs[0] if blobs else memoryview(b"")

    def close(self) -> None:
        self.channel.close()


class DataSender(Protocol):
    def send(self, header: dict[str, Any], logits: np.ndarray, frame: Any, timeout: float | None = None) -> None: ...

    def close(self) -> None: ...


class DataReceiver(Protocol):
    def recv(self, timeout: float | None = None) -> tuple[dict[str, Any], np.ndarray, memoryview]: ...

    def close(self) -> None: ...


class ChannelSender:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def send(self, header: dict[str, Any], logits: np.ndarray, frame: Any, timeout: float | None = None) -> None:
        self.channel.send({"op": "deliver", **header}, np.ascontiguousarray(logits, dtype=np.float32), frame)

    def close(self) -> None:
        try:  # a link closed on purpose (replaced, unlinked) says so: the receiver must not take it for a break
            self.channel.send({"op": "bye"})
        except TransportClosed:
            pass
        self.channel.close()


class ChannelReceiver:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def recv(self, timeout: float | None = None) -> tuple[dict[str, Any], np.ndarray, memoryview]:
        header, blobs = self.channel.recv(timeout)
        logits = np.frombuffer(blobs[0], dtype=np.float32).copy()
        return header, logits, blobs[1]

    def close(self) -> None:
        self.channel.close()


class ShmDataSender:
    def __init__(self, name: str) -> None:
        self.ring = ShmSender(name)

    def send(self, header: dict[str, Any], logits: np.ndarray, frame: Any, timeout: float | None = None) -> None:
        lg = np.ascontiguousarray(logits, dtype=np.float32)
        self.ring.send(_record(header, 4) + lg.tobytes(), timeout)  # logits start 4-byte aligned in the record
        self.ring.send(frame, timeout)

    def close(self) -> None:
        self.ring.close()


class ShmDataReceiver:
    def __init__(self, capacity: int) -> None:
        self.ring = ShmReceiver(capacity)

    @property
    def name(self) -> str:
        return self.ring.name

    def recv(self, timeout: float | None = None) -> tuple[dict[str, Any], np.ndarray, memoryview]:
        rec = self.ring.recv(timeout)
        header, at = _split(rec)
        logits = np.frombuffer(rec, dtype=np.float32, offset=at).copy()  # the next recv reuses the room
        del rec
        frame = self.ring.recv(60.0)  # the sender writes both records back to back
        return header, logits, frame

    def close(self) -> None:
        self.ring.close()
