"""Channel: the P/D control plane between processes, one TCP connection carrying messages both ways.

A message is a JSON header (a dict) and zero or more binary blobs (logits, a KV frame):

    <4-byte magic "FAKC"> <u32 header length> <u32 blob count> <u64 blob length> x count  <header> <blobs>

Blobs are read with `recv_into` into buffers the channel keeps and grows (never one per message), so a
KV frame crosses without a Python loop or an intermediate bytes object; a received blob is a view valid
until the next `recv` on that channel. Sends are serialised by a lock (several threads share a channel);
one thread receives. A peer that closes, dies or sends garbage raises ChannelClosed: the caller marks
the peer down, it never guesses at a half-read message.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from typing import Any

from engine.wire.tcp import tune
from engine.wire.transport import Buffer, TransportClosed, TransportTimeout

MAGIC = b"FAKC"
_HEAD = struct.Struct("<4sII")
_LEN = struct.Struct("<Q")
MAX_HEADER = 64 << 20
MAX_BLOB = 1 << 36
MAX_BLOBS = 8


class ChannelClosed(TransportClosed):
    """The peer closed the connection, died, or sent something that is not a channel message."""


def parse_address(text: str, what: str = "address") -> tuple[str, int]:
    """HOST:PORT (a URL's scheme and path are tolerated: tcp://h:p, http://h:p/) -> (host, port)."""
    t = text.strip()
    if "://" in t:
        t = t.split("://", 1)[1]
    t = t.rstrip("/")
    host, sep, port = t.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{what} {text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class Channel:
    def __init__(self, sock: socket.socket, peer: str = "peer") -> None:
        tune(sock)
        self.sock = sock
        self.peer = peer
        self._send_lock = threading.Lock()
        self._bufs: list[bytearray] = []
        self._hdr = bytearray(_HEAD.size)
        self.closed = False
        self.bytes_in = 0
        self.bytes_out = 0

    @classmethod
    def connect(cls, host: str, port: int, timeout: float = 10.0, peer: str | None = None) -> Channel:
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise ChannelClosed(f"cannot connect to {host}:{port} ({exc})") from None
        sock.settimeout(None)
        return cls(sock, peer or f"{host}:{port}")

    # ------------------------------------------------------------------ send (any thread)
    def send(self, header: dict[str, Any], *blobs: Buffer) -> None:
        views = [memoryview(b).cast("B") for b in blobs]
        text = json.dumps(header, separators=(",", ":")).encode()
        pre = _HEAD.pack(MAGIC, len(text), len(views)) + b"".join(_LEN.pack(len(v)) for v in views) + text
        with self._send_lock:
            if self.closed:
                raise ChannelClosed(f"channel to {self.peer} is closed")
            try:
                self.sock.sendall(pre)
                for v in views:
                    self.sock.sendall(v)
            except OSError as exc:
                self.closed = True
                raise ChannelClosed(f"{self.peer}: connection lost while sending ({exc})") from None
            self.bytes_out += len(pre) + sum(len(v) for v in views)

    # ------------------------------------------------------------------ receive (one thread)
    def _fill(self, view: memoryview, timeout: float | None) -> None:
        got, n = 0, len(view)
        self.sock.settimeout(timeout)
        while got < n:
            try:
                k = self.sock.recv_into(view[got:], n - got)
            except TimeoutError:
                if got == 0 and view.obj is self._hdr:
                    raise TransportTimeout(f"{self.peer}: no message within {timeout} s") from None
                timeout = None  # a message has begun: finish it
                self.sock.settimeout(None)
                continue
            except OSError as exc:
                self.closed = True
                raise ChannelClosed(f"{self.peer}: connection lost ({exc})") from None
            if k == 0:
                self.closed = True
                raise ChannelClosed(f"{self.peer} closed the connection")
            got += k

    def recv(self, timeout: float | None = None) -> tuple[dict[str, Any], list[memoryview]]:
        """The next message: its header and blob views (valid until the next recv)."""
        self._fill(memoryview(self._hdr), timeout)
        magic, hlen, count = _HEAD.unpack(self._hdr)
        if magic != MAGIC or hlen > MAX_HEADER or count > MAX_BLOBS:
            self.closed = True
            raise ChannelClosed(f"{self.peer} sent something that is not a fak channel message")
        lens = bytearray(_LEN.size * count)
        self._fill(memoryview(lens), None)
        sizes = [_LEN.unpack_from(lens, i * _LEN.size)[0] for i in range(count)]
        if any(s > MAX_BLOB for s in sizes):
            self.closed = True
            raise ChannelClosed(f"{self.peer} announced a blob larger than {MAX_BLOB} bytes")
        text = bytearray(hlen)
        self._fill(memoryview(text), None)
        try:
            header = json.loads(text)
        except ValueError:
            self.closed = True
            raise ChannelClosed(f"{self.peer} sent a header that is not JSON") from None
        views = []
        for i, n in enumerate(sizes):
            while len(self._bufs) <= i:
                self._bufs.append(bytearray(0))
            if len(self._bufs[i]) < n:
                self._bufs[i] = bytearray(max(n, 2 * len(self._bufs[i])))  # grow once, reuse after
            v = memoryview(self._bufs[i])[:n]
            self._fill(v, None)
            views.append(v)
        self.bytes_in += _HEAD.size + len(lens) + hlen + sum(sizes)
        return header, views

    def close(self) -> None:
        with self._send_lock:
            self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
