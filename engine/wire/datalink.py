"""DataLink: how a prefill worker process hands a prefilled prompt to a decode worker process.

One delivery is a small JSON header (the request, its prompt ids, the blocks the decode worker reserved),
the last position's logits, and the KV frame. Two kinds, chosen per link:

    tcp  one Channel message with two blobs (across hosts; recv_into preallocated buffers)
    shm  two records in the decode worker's shared-memory ring (same host): header + logits, then the
         frame, which the decode worker imports straight from the ring (no socket, no pickling)

Deliveries on one link arrive in the order sent; each link has one sender.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Protocol

import numpy as np

from engine.wire.channel import Channel
from engine.wire.shm import ShmReceiver, ShmSender

_HLEN = struct.Struct("<I")


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
        text = json.dumps(header, separators=(",", ":")).encode()
        pad = -(_HLEN.size + len(text)) % 4  # logits start 4-byte aligned in the record
        lg = np.ascontiguousarray(logits, dtype=np.float32)
        self.ring.send(_HLEN.pack(len(text) + pad) + text + b" " * pad + lg.tobytes(), timeout)
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
        (n,) = _HLEN.unpack_from(rec)
        header = json.loads(bytes(rec[_HLEN.size : _HLEN.size + n]))
        logits = np.frombuffer(rec, dtype=np.float32, offset=_HLEN.size + n).copy()  # the next recv reuses the room
        del rec
        frame = self.ring.recv(60.0)  # the sender writes both records back to back
        return header, logits, frame

    def close(self) -> None:
        self.ring.close()
