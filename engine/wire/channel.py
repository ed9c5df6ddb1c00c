"""Channel: the P/D control plane between processes, one TCP connection carrying messages both ways.

A message is a JSON header (a dict) and zero or more binary blobs (logits, a KV frame):

    <4-byte magic "FAKC"> <u32 header length> <u32 blob count> <u64 blob length> x count  <header> <blobs>

With a cluster key (engine/wire/secure.py) the two ends first prove the key to each other, and every
message is sealed: magic "FAKS", the sender's sequence number after the counts, a 16-byte AES-GCM tag
after the blobs (header and blobs encrypted too with `encrypt`). `recv` returns a message only once its
tag and sequence number check; a failure closes the channel like a dead peer.

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
import time
from typing import Any

from engine.wire.secure import (
    HELLO_MAGIC,
    SEALED_MAGIC,
    TAG_BYTES,
    InvalidTag,
    LinkKey,
    LinkRefused,
    LinkTampered,
    Session,
    client_handshake,
    recv_exact,
    server_handshake,
)
from engine.wire.tcp import tune
from engine.wire.transport import Buffer, TransportClosed, TransportTimeout

MAGIC = b"FAKC"
_HEAD = struct.Struct("<4sII")
_LEN = struct.Struct("<Q")
_SEQ = struct.Struct("<Q")
CHUNK = 1 << 20  # sealing works a MiB at a time, between socket calls: the bytes are still in cache
MAX_HEADER = 64 << 20
MAX_BLOB = 1 << 36
MAX_BLOBS = 8


class ChannelClosed(TransportClosed):
    """The peer closed the connection, died, or sent something that is not a channel message."""


class ChannelRefused(ChannelClosed):
    """The link handshake failed: one end has no cluster key, or another one."""


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


def _chunks(view: memoryview) -> list[memoryview]:
    return [view[i : i + CHUNK] for i in range(0, len(view), CHUNK)] or [view]


class Channel:
    def __init__(self, sock: socket.socket, peer: str = "peer", session: Session | None = None) -> None:
        tune(sock)
        self.sock = sock
        self.peer = peer
        self.session = session
        self._sbuf = bytearray(CHUNK + 16) if session is not None and session.encrypt else None
        self._send_lock = threading.Lock()
        self._bufs: list[bytearray] = []
        self._hdr = bytearray(_HEAD.size)
        self.closed = False
        self.bytes_in = 0
        self.bytes_out = 0

    @classmethod
    def connect(cls, host: str, port: int, timeout: float = 10.0, peer: str | None = None,
                key: LinkKey | None = None) -> Channel:
        """A channel to a node; with `key`, handshaken (ChannelClosed names why a handshake failed)."""
        name = peer or f"{host}:{port}"
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise ChannelClosed(f"cannot connect to {host}:{port} ({exc})") from None
        sock.settimeout(None)
        session = None
        if key is not None:
            try:
                session = client_handshake(sock, key, timeout)
            except LinkRefused as e:
                sock.close()
                raise ChannelRefused(f"{name}: {e}") from None
        return cls(sock, name, session)

    @classmethod
    def accept(cls, sock: socket.socket, peer: str, key: LinkKey | None, timeout: float = 10.0) -> Channel:
        """The server's end of a new connection: handshaken when this node has a key. A client that does not
        speak the same (a keyless one to a keyed node, or the reverse) is told why in a plain message and
        refused (LinkRefused)."""
        deadline = time.monotonic() + timeout  # the whole greeting, however the peer trickles it
        first = b""
        try:
            while len(first) < 4:  # a peek returns what has arrived: a hello split over packets comes in parts
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("timed out")
                sock.settimeout(left)
                first = sock.recv(4, socket.MSG_PEEK)
                if not first:
                    raise OSError("closed")
                if len(first) < 4:
                    time.sleep(0.01)
        except OSError as e:
            sock.close()
            raise LinkRefused(f"{peer}: nothing received ({e})") from None
        sock.settimeout(None)
        if key is None and first != HELLO_MAGIC:
            return cls(sock, peer)
        if key is not None and first == HELLO_MAGIC:
            try:
                return cls(sock, peer, server_handshake(sock, key, recv_exact(sock, 4, deadline), timeout, deadline))
            except LinkRefused as e:
                sock.close()
                raise LinkRefused(f"{peer}: {e}") from None
        why = ("this node requires the cluster key (--key or FAK_PD_KEY)" if key is not None
               else "this node has no cluster key (start it with the same --key or FAK_PD_KEY)")
        try:
            cls(sock, peer).send({"op": "hello", "error": why})
        except ChannelClosed:
            pass
        sock.close()
        raise LinkRefused(f"{peer}: refused a {'keyless' if key is not None else 'keyed'} client: {why}")

    # ------------------------------------------------------------------ send (any thread)
    def send(self, header: dict[str, Any], *blobs: Buffer) -> None:
        views = [memoryview(b).cast("B") for b in blobs]
        text = json.dumps(header, separators=(",", ":")).encode()
        lens = b"".join(_LEN.pack(len(v)) for v in views)
        with self._send_lock:
            if self.closed:
                raise ChannelClosed(f"channel to {self.peer} is closed")
            try:
                if self.session is None:
                    pre = _HEAD.pack(MAGIC, len(text), len(views)) + lens + text
                    self.sock.sendall(pre)
                    for v in views:
                        for c in _chunks(v):
                            self.sock.sendall(c)
                    sent = len(pre)
                else:
                    sent = self._send_sealed(text, lens, views)
            except OSError as exc:
                self.closed = True
                raise ChannelClosed(f"{self.peer}: connection lost while sending ({exc})") from None
            except BaseException:  # half a message may be on the wire: nothing more can follow it
                self.closed = True
                raise
            self.bytes_out += sent + sum(len(v) for v in views)

    def _send_sealed(self, text: bytes, lens: bytes, views: list[memoryview]) -> int:
        """One sealed message (the send lock held); returns the bytes sent besides the blobs."""
        assert self.session is not None
        seq, enc = self.session.sealer()
        pre = _HEAD.pack(SEALED_MAGIC, len(text), len(views)) + _SEQ.pack(seq) + lens
        enc.authenticate_additional_data(pre)  # type: ignore[attr-defined]
        pre += self.session.framing_tag(seq, pre)  # the receiver checks it before allocating what pre announces
        if self._sbuf is None:  # MAC only: everything is additional data, sent as it is covered
            enc.authenticate_additional_data(text)  # type: ignore[attr-defined]
            self.sock.sendall(pre + text)
            for v in views:
                for c in _chunks(v):
                    enc.authenticate_additional_data(c)  # type: ignore[attr-defined]
                    self.sock.sendall(c)
        else:  # encrypted: a MiB at a time into the send buffer, then onto the socket
            self.sock.sendall(pre)
            out = memoryview(self._sbuf)
            for part in (memoryview(text), *views):
                for c in _chunks(part):
                    n = enc.update_into(c, out)  # type: ignore[attr-defined]
                    self.sock.sendall(out[:n])
        enc.finalize()  # type: ignore[attr-defined]
        self.sock.sendall(enc.tag)  # type: ignore[attr-defined]
        return len(pre) + len(text) + TAG_BYTES

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
        try:
            return self._recv(timeout)
        except (MemoryError, ValueError) as e:  # a size this host cannot hold, a cipher refusing a length
            self.closed = True
            raise ChannelClosed(f"{self.peer}: message refused ({type(e).__name__}: {e})") from None

    def _recv(self, timeout: float | None) -> tuple[dict[str, Any], list[memoryview]]:
        self._fill(memoryview(self._hdr), timeout)
        magic, hlen, count = _HEAD.unpack(self._hdr)
        sealed = self.session is not None
        if magic != (SEALED_MAGIC if sealed else MAGIC) or hlen > MAX_HEADER or count > MAX_BLOBS:
            self.closed = True
            what = "an unsealed message on a keyed link" if sealed and magic == MAGIC else \
                "something that is not a fak channel message"
            raise ChannelClosed(f"{self.peer} sent {what}")
        opener = None
        if sealed:
            assert self.session is not None
            seq = bytearray(_SEQ.size)
            self._fill(memoryview(seq), None)
            try:
                opener = self.session.opener(_SEQ.unpack(seq)[0])
            except LinkTampered as e:
                self.closed = True
                raise ChannelClosed(f"{self.peer}: link tampered with: {e}") from None
        lens = bytearray(_LEN.size * count)
        self._fill(memoryview(lens), None)
        sizes = [_LEN.unpack_from(lens, i * _LEN.size)[0] for i in range(count)]
        if any(s > MAX_BLOB for s in sizes):
            self.closed = True
            raise ChannelClosed(f"{self.peer} announced a blob larger than {MAX_BLOB} bytes")
        if opener is not None:
            framing = bytes(self._hdr) + bytes(seq) + bytes(lens)
            ftag = bytearray(TAG_BYTES)
            self._fill(memoryview(ftag), None)
            try:
                self.session.check_framing(_SEQ.unpack(seq)[0], framing, bytes(ftag))  # type: ignore[union-attr]
            except LinkTampered as e:
                self.closed = True
                raise ChannelClosed(f"{self.peer}: link tampered with: {e}") from None
            opener.authenticate_additional_data(framing)  # type: ignore[attr-defined]
        text = bytearray(hlen)
        self._fill_open(memoryview(text), opener)
        views = []
        for i, n in enumerate(sizes):
            while len(self._bufs) <= i:
                self._bufs.append(bytearray(0))
            if len(self._bufs[i]) < n:
                self._bufs[i] = bytearray(max(n, 2 * len(self._bufs[i])))  # grow once, reuse after
            v = memoryview(self._bufs[i])[:n]
            self._fill_open(v, opener)
            views.append(v)
        extra = 0
        if opener is not None:
            tag = bytearray(TAG_BYTES)
            self._fill(memoryview(tag), None)
            try:
                opener.finalize_with_tag(bytes(tag))  # type: ignore[attr-defined]
            except InvalidTag:
                self.closed = True
                raise ChannelClosed(f"{self.peer}: link tampered with: message {_SEQ.unpack(seq)[0]} fails its "
                                    "authentication tag (bytes changed in transit or a wrong key)") from None
            extra = _SEQ.size + 2 * TAG_BYTES
        try:
            header = json.loads(text)
        except ValueError:
            self.closed = True
            raise ChannelClosed(f"{self.peer} sent a header that is not JSON") from None
        self.bytes_in += _HEAD.size + len(lens) + hlen + sum(sizes) + extra
        return header, views

    def _fill_open(self, view: memoryview, opener: Any) -> None:
        """Fill `view`; on a sealed link, cover (MAC) or decrypt (in place) each MiB as it lands."""
        for c in _chunks(view):  # a MiB at a time even in plain: the copy out of the socket stays in cache
            self._fill(c, None)
            if opener is None:
                continue
            if self.session is not None and self.session.encrypt:
                opener.update_into(c, c)
            else:
                opener.authenticate_additional_data(c)

    def close(self) -> None:
        with self._send_lock:
            self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
