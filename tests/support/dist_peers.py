"""Peer processes for the transport tests (spawned: importable top-level functions, small pickled args)."""

from __future__ import annotations

import numpy as np
import xxhash


def payload(seed: int, n: int) -> bytes:
    """Deterministic frame bytes both processes can rebuild."""
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8).tobytes()


def shm_send(name: str, sizes: list[int], close: bool) -> None:
    from engine.wire.shm import ShmSender

    s = ShmSender(name)
    for i, n in enumerate(sizes):
        s.send(payload(i, n), timeout=20)
    if close:
        s.close()


def tcp_recv(port_q: object, result_q: object, count: int) -> None:
    """Listen, report the port, receive `count` frames and report their digests (then the error, if any)."""
    from engine.wire.tcp import TcpReceiver

    r = TcpReceiver()
    port_q.put(r.address[1])  # type: ignore[attr-defined]
    out: list[object] = []
    try:
        for _ in range(count):
            out.append(xxhash.xxh3_128_hexdigest(r.recv(timeout=20)))
        r.recv(timeout=20)
    except Exception as exc:  # noqa: BLE001 (reported to the test, which asserts on the message)
        out.append(f"{type(exc).__name__}: {exc}")
    result_q.put(out)  # type: ignore[attr-defined]
    r.close()


def tcp_send_partial(port: int, n: int) -> None:
    """Send a length prefix for n bytes, half of them, and die (no close handshake of the frame)."""
    import os
    import socket
    import struct

    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(struct.pack("<Q", n) + payload(0, n // 2))
    os._exit(0)
