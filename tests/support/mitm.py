"""A man in the middle for fak's worker links: a TCP proxy that understands the channel's framing and
attacks one message.

    python tests/support/mitm.py LISTEN_HOST:PORT TARGET_HOST:PORT '{"op": "deliver", "action": "flip"}'

It forwards every connection to the target both ways, passes the link handshake through untouched, and
reads messages (plain "FAKC" or sealed "FAKS": the header is clear text unless the link is encrypted).
The first client-to-server message whose header op is `op` (any message when `op` is "*") is attacked:

    flip     one bit flipped in the middle of its largest blob (a KV frame), else of its header
    length   its largest blob's announced length raised to 32 GiB (the receiver must not allocate it)
    replay   forwarded, then sent again
    reorder  held back and forwarded after the next message
    none     forwarded as is (the control: the proxy alone breaks nothing)

Every `count` matching messages (default 1: only the first) are attacked. It prints one JSON line when
listening ({"mitm": "ready", "port": N}) and one per attack ({"mitm": "flip", "op": ..., "bytes": N}), so
the test knows the attack happened. Standard library only: it runs in a namespace of its own.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
from typing import Any

_HEAD = struct.Struct("<4sII")
HELLO = 4 + 2 + 2 + 32  # engine/wire/secure.py: magic, version, flags, nonce
PROOF = 32


class Attack:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.op = str(spec.get("op", "*"))
        self.action = str(spec.get("action", "none"))
        self.left = int(spec.get("count", 1))
        self.lock = threading.Lock()

    def wants(self, op: str) -> bool:
        with self.lock:
            if self.left > 0 and self.action != "none" and (self.op == "*" or op == self.op):
                self.left -= 1
                return True
            return False


def _read(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise EOFError
        out += chunk
    return bytes(out)


def _message(src: socket.socket) -> tuple[bytes, str, list[tuple[int, int]], tuple[int, int]]:
    """One whole message: its bytes, its op ("?" when encrypted or unreadable), the (start, length) of each
    blob and of the header text within it."""
    head = _read(src, _HEAD.size)
    magic, hlen, count = _HEAD.unpack(head)
    sealed = magic == b"FAKS"
    seq = _read(src, 8) if sealed else b""
    lens = _read(src, 8 * count)
    ftag = _read(src, 16) if sealed else b""  # the tag over the framing alone
    sizes = [struct.unpack_from("<Q", lens, 8 * i)[0] for i in range(count)]
    text = _read(src, hlen)
    at = len(head) + len(seq) + len(lens) + len(ftag)
    blobs, pos = [], at + hlen
    body = bytearray()
    for n in sizes:
        body += _read(src, n)
        blobs.append((pos, n))
        pos += n
    tag = _read(src, 16) if sealed else b""
    try:
        op = str(json.loads(text).get("op", "?"))
    except (ValueError, UnicodeDecodeError, AttributeError):
        op = "?"
    return head + seq + lens + ftag + text + bytes(body) + tag, op, blobs, (at, hlen)


def _say(what: dict[str, Any]) -> None:
    print(json.dumps(what), flush=True)


def _pump(src: socket.socket, dst: socket.socket, attack: Attack | None, handshake: list[int]) -> None:
    """Forward src -> dst: first the handshake's fixed-size parts, then message by message."""
    held: bytes | None = None
    try:
        first = _read(src, 4)
        if first == b"FAKH":  # a keyed link: hellos and proofs pass through as they are
            dst.sendall(first + _read(src, HELLO - 4))
            for n in handshake:
                dst.sendall(_read(src, n))
            rest = b""
        else:
            rest = first
        while True:
            if rest:  # the 4 bytes already read belong to the first message
                src_msg = _Prefixed(rest, src)
                rest = b""
                data, op, blobs, text = _message(src_msg)  # type: ignore[arg-type]
            else:
                data, op, blobs, text = _message(src)
            if attack is not None and attack.wants(op):
                if attack.action == "flip":
                    buf = bytearray(data)
                    start, n = max(blobs, key=lambda b: b[1]) if blobs else text
                    buf[start + n // 2] ^= 0x10
                    dst.sendall(bytes(buf))
                    _say({"mitm": "flip", "op": op, "bytes": len(data)})
                elif attack.action == "length":
                    buf = bytearray(data)
                    sealed = data[:4] == b"FAKS"
                    i = max(range(len(blobs)), key=lambda j: blobs[j][1]) if blobs else 0
                    struct.pack_into("<Q", buf, _HEAD.size + (8 if sealed else 0) + 8 * i, 1 << 35)
                    dst.sendall(bytes(buf))
                    _say({"mitm": "length", "op": op, "bytes": len(data)})
                elif attack.action == "replay":
                    dst.sendall(data)
                    dst.sendall(data)
                    _say({"mitm": "replay", "op": op, "bytes": len(data)})
                elif attack.action == "reorder":
                    held = data
                    _say({"mitm": "hold", "op": op, "bytes": len(data)})
                continue
            dst.sendall(data)
            if held is not None:
                dst.sendall(held)
                held = None
                _say({"mitm": "reorder", "op": op})
    except (EOFError, OSError):
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Prefixed:
    """A socket whose first bytes were already read."""

    def __init__(self, prefix: bytes, sock: socket.socket) -> None:
        self.prefix, self.sock = prefix, sock

    def recv(self, n: int) -> bytes:
        if self.prefix:
            out, self.prefix = self.prefix[:n], self.prefix[n:]
            return out
        return self.sock.recv(n)


def serve(listen: tuple[str, int], target: tuple[str, int], attack: Attack) -> socket.socket:
    """Start proxying in threads; returns the listening socket (close it to stop accepting)."""
    lst = socket.create_server(listen)

    def accept() -> None:
        while True:
            try:
                client, _ = lst.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(target, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            # client -> server carries the client's proof after the hellos; server -> client the server's
            # proof and its one-byte verdict
            threading.Thread(target=_pump, args=(client, server, attack, [PROOF]), daemon=True).start()
            threading.Thread(target=_pump, args=(server, client, None, [PROOF, 1]), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return lst


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> None:
    listen, target = _address(sys.argv[1]), _address(sys.argv[2])
    attack = Attack(json.loads(sys.argv[3]) if len(sys.argv) > 3 else {})
    lst = serve(listen, target, attack)
    _say({"mitm": "ready", "port": lst.getsockname()[1]})
    threading.Event().wait()


if __name__ == "__main__":
    main()
