"""TCP transport: frames as an 8-byte little-endian length then the frame bytes, one connection per link.

The receiver keeps one preallocated buffer (grown geometrically, never per frame) and fills it with
`recv_into` on memoryview slices: the kernel copies socket data straight into it, no Python per byte
and no intermediate bytes objects. `recv` returns a view into that buffer, valid until the next `recv`.
"""

from __future__ import annotations

import socket
import struct

from engine.wire.transport import (
    Buffer,
    TransportClosed,
    TransportError,
    TransportTimeout,
)

_LEN = struct.Struct("<Q")
MAX_FRAME = 1 << 36  # 64 GiB: a length past this is a corrupt or foreign stream, not a frame
# A link whose peer stops acknowledging (a cut cable, a partition, a host gone without a RST) fails within
# this bound instead of blocking a send forever: TCP_USER_TIMEOUT for data in flight, keepalive probes for
# an idle connection (idle 5 s, then 3 probes 2 s apart). Heartbeats (1/s) keep links busy, so ~10 s.
USER_TIMEOUT_MS = 10_000


def tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # the length prefix must not wait for Nagle
    for level, opt, val in ((socket.SOL_SOCKET, "SO_KEEPALIVE", 1), (socket.IPPROTO_TCP, "TCP_KEEPIDLE", 5),
                            (socket.IPPROTO_TCP, "TCP_KEEPINTVL", 2), (socket.IPPROTO_TCP, "TCP_KEEPCNT", 3),
                            (socket.IPPROTO_TCP, "TCP_USER_TIMEOUT", USER_TIMEOUT_MS)):
        if hasattr(socket, opt):  # Linux has them all; elsewhere the heartbeat alone bounds it
            try:
                sock.setsockopt(level, getattr(socket, opt), val)
            except OSError:
                pass
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
        except OSError:
            pass


class TcpReceiver:
    """Listens on host:port (port 0 -> a free one, see `.address`) and accepts one sender."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, capacity: int = 1 << 20) -> None:
        self._listener = socket.create_server((host, port))
        bound = self._listener.getsockname()
        self._address = (str(bound[0]), int(bound[1]))
        self._conn: socket.socket | None = None
        self._buf = bytearray(capacity)
        self._hdr = bytearray(_LEN.size)
        self._closed = False

    @property
    def address(self) -> tuple[str, int]:
        return self._address

    def _accept(self, timeout: float | None) -> socket.socket:
        if self._conn is None:
            self._listener.settimeout(timeout)
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                raise TransportTimeout(f"tcp transport: no sender connected within {timeout} s") from None
            tune(conn)
            self._conn = conn
        return self._conn

    def _fill(self, conn: socket.socket, view: memoryview, what: str, timeout: float | None) -> None:
        got, n = 0, len(view)
        while got < n:
            try:
                k = conn.recv_into(view[got:], n - got)
            except TimeoutError:
                raise TransportTimeout(f"tcp transport: {what} stalled at {got} of {n} bytes for {timeout} s") from None
            except OSError as exc:
                raise TransportClosed(f"tcp transport: connection lost during {what} ({exc})") from None
            if k == 0:
                at = "between frames" if got == 0 and what == "a frame length" else f"after {got} of {n} bytes of {what}"
                raise TransportClosed(f"tcp transport: the sender closed the connection {at}")
            got += k

    def recv(self, timeout: float | None = None) -> memoryview:
        if self._closed:
            raise TransportClosed("tcp transport: receiver already closed")
        conn = self._accept(timeout)
        conn.settimeout(timeout)
        self._fill(conn, memoryview(self._hdr), "a frame length", timeout)
        (n,) = _LEN.unpack(self._hdr)
        if n > MAX_FRAME:
            raise TransportError(f"tcp transport: frame length {n} exceeds {MAX_FRAME} (not a fak KV stream?)")
        if n > len(self._buf):
            self._buf = bytearray(max(n, 2 * len(self._buf)))  # grow once, reuse for every later frame
        view = memoryview(self._buf)[:n]
        self._fill(conn, view, "a frame", timeout)
        return view

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._conn is not None:
            self._conn.close()
        self._listener.close()


class TcpSender:
    def __init__(self, host: str, port: int, timeout: float | None = 10.0) -> None:
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise TransportClosed(f"tcp transport: cannot connect to {host}:{port} ({exc})") from None
        tune(self._sock)
        self._closed = False

    def send(self, frame: Buffer, timeout: float | None = None) -> None:
        if self._closed:
            raise TransportClosed("tcp transport: sender already closed")
        view = memoryview(frame).cast("B")
        self._sock.settimeout(timeout)
        try:
            self._sock.sendall(_LEN.pack(len(view)))
            self._sock.sendall(view)
        except TimeoutError:
            raise TransportTimeout(f"tcp transport: a {len(view)}-byte frame not sent within {timeout} s") from None
        except OSError as exc:
            raise TransportClosed(f"tcp transport: the receiver closed the connection ({exc})") from None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._sock.close()
