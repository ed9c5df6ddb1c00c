"""Message links between pipeline stages: a JSON header and one blob (hidden rows), in order, one way.

    QueueLink    in one process (threads): the reference, a queue of (header, copy of the blob)
    RingLink     one host: a shared-memory ring (engine/wire/shm.py), header and blob in one record
    ChannelLink  across hosts: a TCP Channel (engine/wire/channel.py), the blob read with recv_into

`recv` returns the blob as a memoryview valid until the next `recv` on that link.
"""

from __future__ import annotations

import json
import queue
import struct
from typing import Any, Protocol

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


def _pack(header: dict[str, Any], blob: Any) -> tuple[bytes, memoryview]:
    text = json.dumps(header, separators=(",", ":")).encode()
    pad = -(_HLEN.size + len(text)) % 8  # the blob starts 8-byte aligned in the record
    return _HLEN.pack(len(text) + pad) + text + b" " * pad, memoryview(blob).cast("B")


class RingSender:
    def __init__(self, name: str) -> None:
        self.ring = ShmSender(name)

    def send(self, header: dict[str, Any], blob: Any) -> None:
        pre, view = _pack(header, blob)
        self.ring.send(pre + view.tobytes(), 60.0)  # hidden rows: KiB per decode step, one copy is nothing

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
        (n,) = _HLEN.unpack_from(rec)
        return json.loads(bytes(rec[_HLEN.size : _HLEN.size + n])), rec[_HLEN.size + n :]

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
