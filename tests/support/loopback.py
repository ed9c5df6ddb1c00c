"""A TCP server on the host's loopback for network-containment tests: counts who reached it and answers
each connection with what `reply` makes of the request's first bytes."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


def reached(_request: bytes) -> bytes:
    return b"HTTP/1.0 200 OK\r\nContent-Length: 14\r\n\r\nhost reached!\n"


def echo_first_line(request: bytes) -> bytes:
    return b"HTTP/1.0 200 OK\r\n\r\ngot " + request.split(b"\r\n", 1)[0]


class LoopbackServer:
    def __init__(self, reply: Callable[[bytes], bytes] = reached, read: bool = False) -> None:
        self.reply, self.read = reply, read
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.hits += 1
            with c:
                c.sendall(self.reply(c.recv(65536) if self.read else b""))

    def close(self) -> None:
        self.sock.close()
