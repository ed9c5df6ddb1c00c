"""Link security: a mutual handshake on the cluster key, then every channel message sealed (AES-256-GCM).

Handshake (before the first channel message; the key never crosses the wire):

    client -> server   "FAKH" version flags  nc (32 random bytes)
    server -> client   "FAKH" version flags' ns (32 random bytes)  proof_s = HMAC(K, "server" | transcript)
    client -> server   proof_c = HMAC(K, "client" | transcript)
    server -> client   one byte: 1 accepted

`transcript` is both hellos (nonces and flags), so each proof is fresh (a recorded one fails against new
nonces) and bound to the flags (a man in the middle cannot turn encryption off). The two labels keep a
server's proof from being reflected back as a client's. Each direction then gets its own key,
HMAC(K, "c2s" | transcript) and HMAC(K, "s2c" | transcript), and a message counter starting at 0.

A sealed message is the channel's framing with magic "FAKS" and the sender's sequence number in clear,
a 16-byte tag over that framing alone (checked before the receiver allocates anything for the lengths it
announces), the header and blobs, then a 16-byte GCM tag over all of it. The nonce is the direction label
and the sequence number, so a replayed, reordered or dropped message fails (the receiver expects exactly the next number), and one
flipped bit anywhere (length, header, logits, K/V) fails the tag. MAC only (the default): the header
and blobs travel in clear as GCM's additional data (GMAC, 18 GB/s here with AES-NI and VPCLMULQDQ;
HMAC-SHA256 runs at 1.8, keyed BLAKE2b at 0.9, Poly1305 at 12). `--link-encrypt`: the header and blobs
are encrypted too (AES-GCM in place at ~10 GB/s; ChaCha20-Poly1305 through `cryptography` is 1 GB/s
one-shot). The receiver verifies the tag before the message is returned: nothing unverified reaches a
caller, and a failure closes the channel (the caller treats the peer as down).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import socket
import struct
import time
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from engine.errors import EngineError

HELLO_MAGIC = b"FAKH"
SEALED_MAGIC = b"FAKS"
VERSION = 1
NONCE_BYTES = 32
PROOF_BYTES = 32
TAG_BYTES = 16
ENCRYPT = 1  # flags bit
_HELLO = struct.Struct(f"<4sHH{NONCE_BYTES}s")
_SEQ = struct.Struct("<Q")
MIN_KEY_CHARS = 16
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class LinkRefused(EngineError):
    """The handshake failed: no key, the wrong key, a peer that is not a fak node, or it timed out."""


class LinkTampered(EngineError):
    """A sealed message failed its tag or arrived out of sequence."""


@dataclass(frozen=True)
class LinkKey:
    """The cluster key as both ends hold it (32 bytes derived from the text the user gave) and whether this
    end asks for encryption. Build with `LinkKey.of(text)`."""

    secret: bytes = field(repr=False)
    encrypt: bool = False

    @classmethod
    def of(cls, text: str | bytes | None, encrypt: bool = False) -> LinkKey | None:
        """None for no key (plain links, loopback only). A key shorter than MIN_KEY_CHARS is refused: the
        server's proof is an HMAC anyone who connects can record, so a short key could be guessed offline."""
        if not text:
            return None
        raw = text.encode() if isinstance(text, str) else bytes(text)
        if len(raw) < MIN_KEY_CHARS:
            raise LinkRefused(f"the cluster key is {len(raw)} characters; use at least {MIN_KEY_CHARS} "
                              "(e.g. python -c \"import secrets; print(secrets.token_hex(32))\")")
        return cls(_derive(raw), encrypt)

    def mac(self, label: bytes, transcript: bytes) -> bytes:
        return hmac.new(self.secret, label + b"\0" + transcript, "sha256").digest()

    @property
    def frame_key(self) -> bytes:
        """The key KV frame descriptors are sealed with (engine/wire/frame.py): its own, 32 bytes, whatever
        the length of the text the user gave (keyed BLAKE2b takes at most 64)."""
        return self.mac(b"kv descriptor seal", b"")[:32]


@functools.lru_cache(maxsize=8)
def _derive(raw: bytes) -> bytes:
    """The link secret from the user's text: PBKDF2 (~0.1 s once per process), so a recorded handshake
    costs a guesser that much per guess."""
    return hashlib.pbkdf2_hmac("sha256", raw, b"fak cluster key v1", 100_000)


def check_bind(host: str, key: LinkKey | None, what: str | None = None) -> None:
    """Refuse to listen beyond loopback without a cluster key (anyone who can reach the port could drive the
    worker and feed it KV)."""
    if key is None and host not in LOOPBACK:
        raise LinkRefused(f"{what or f'--listen {host}'}: listening beyond loopback needs the cluster key "
                          "(--key or FAK_PD_KEY on every worker and head)")


class _Direction:
    """One direction of a sealed channel: its AES key, its 4-byte nonce label, its next sequence number."""

    def __init__(self, key: bytes, label: bytes) -> None:
        self.aes = algorithms.AES(key)
        self.label = label
        self.seq = 0

    def nonce(self, seq: int) -> bytes:
        return self.label + _SEQ.pack(seq)


class Session:
    """A handshaken link's two directions and whether its payloads are encrypted."""

    def __init__(self, tx_key: bytes, tx_label: bytes, rx_key: bytes, rx_label: bytes, encrypt: bool) -> None:
        self.tx = _Direction(tx_key, tx_label)
        self.rx = _Direction(rx_key, rx_label)
        self.encrypt = encrypt

    def sealer(self) -> tuple[int, object]:
        """The next outgoing sequence number and a GCM encryptor for it."""
        seq = self.tx.seq
        self.tx.seq += 1
        return seq, Cipher(self.tx.aes, modes.GCM(self.tx.nonce(seq))).encryptor()

    def framing_tag(self, seq: int, framing: bytes) -> bytes:
        """The tag over a message's framing alone (its own nonce space: the label's last byte 'h')."""
        e = Cipher(self.tx.aes, modes.GCM(self.tx.label[:3] + b"h" + _SEQ.pack(seq))).encryptor()
        e.authenticate_additional_data(framing)
        e.finalize()
        return e.tag

    def check_framing(self, seq: int, framing: bytes, tag: bytes) -> None:
        """LinkTampered unless `tag` is the sender's over this framing (before anything it announces is
        allocated)."""
        d = Cipher(self.rx.aes, modes.GCM(self.rx.label[:3] + b"h" + _SEQ.pack(seq))).decryptor()
        d.authenticate_additional_data(framing)
        try:
            d.finalize_with_tag(tag)
        except InvalidTag:
            raise LinkTampered(f"message {seq}'s framing fails its tag (lengths changed in transit)") from None

    def opener(self, seq: int) -> object:
        """A GCM decryptor for the next incoming message; LinkTampered when `seq` is not the one expected."""
        want = self.rx.seq
        if seq != want:
            what = "replayed" if seq < want else "out of order or after a dropped one"
            raise LinkTampered(f"message {seq} when {want} was next ({what})")
        self.rx.seq += 1
        return Cipher(self.rx.aes, modes.GCM(self.rx.nonce(seq))).decryptor()  # tag: finalize_with_tag


def recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """n bytes; with a deadline (monotonic) the whole read is bounded, not each recv: a peer that trickles
    a byte at a time cannot hold a handshake open."""
    out = bytearray()
    while len(out) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise LinkRefused("the peer closed the connection during the handshake")
        out += chunk
    return bytes(out)


def _session(key: LinkKey, transcript: bytes, flags: int, client: bool) -> Session:
    c2s, s2c = key.mac(b"c2s", transcript), key.mac(b"s2c", transcript)
    enc = bool(flags & ENCRYPT)
    if client:
        return Session(c2s, b"c2s\0", s2c, b"s2c\0", enc)
    return Session(s2c, b"s2c\0", c2s, b"c2s\0", enc)


def client_handshake(sock: socket.socket, key: LinkKey, timeout: float = 10.0) -> Session:
    """Prove the key to a server and check its proof; the socket then carries sealed messages."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        hello_c = _HELLO.pack(HELLO_MAGIC, VERSION, ENCRYPT if key.encrypt else 0, os.urandom(NONCE_BYTES))
        sock.sendall(hello_c)
        first = recv_exact(sock, 4, deadline)
        if first != HELLO_MAGIC:
            raise LinkRefused(_plain_refusal(sock, first))
        hello_s = first + recv_exact(sock, _HELLO.size - 4, deadline)
        _, version, flags, _ = _HELLO.unpack(hello_s)
        if version != VERSION:
            raise LinkRefused(f"link handshake version {version}, this build speaks {VERSION}")
        transcript = hello_c + hello_s
        if not hmac.compare_digest(recv_exact(sock, PROOF_BYTES, deadline), key.mac(b"server", transcript)):
            raise LinkRefused("the peer does not hold the cluster key (its proof does not verify)")
        if key.encrypt and not flags & ENCRYPT:  # the proof covers the flags; checked anyway
            raise LinkRefused("the peer did not grant the encryption this end asked for")
        sock.sendall(key.mac(b"client", transcript))
        if recv_exact(sock, 1, deadline) != b"\1":
            raise LinkRefused("the peer refused our proof")
    except TimeoutError:
        raise LinkRefused(f"no handshake answer within {timeout:.0f} s") from None
    except OSError as e:
        raise LinkRefused(f"connection lost during the handshake ({e})") from None
    finally:
        sock.settimeout(None)
    return _session(key, transcript, flags, client=True)


def _plain_refusal(sock: socket.socket, first: bytes) -> str:
    """A keyless peer answers a hello with a plain channel message (its error); read what it says."""
    if first == b"FAKC":
        try:
            sock.settimeout(2.0)
            rest = sock.recv(4096)
            start = rest.find(b"{")
            if start >= 0:
                import json

                msg = json.loads(rest[start : rest.rfind(b"}") + 1])
                if isinstance(msg, dict) and msg.get("error"):  # the peer's words: printable, bounded
                    said = "".join(ch for ch in str(msg["error"]) if ch.isprintable())[:200]
                    return f"the peer refused the link: {said}"
        except (OSError, ValueError):
            pass
        return "the peer has no cluster key (it answered in clear)"
    return f"the peer is not a fak node (it answered {first!r})"


def server_handshake(sock: socket.socket, key: LinkKey, first: bytes, timeout: float = 10.0,
                     deadline: float | None = None) -> Session:
    """Answer a client's hello (whose first 4 bytes, `first`, the caller already read) and check its proof,
    all of it within `deadline` (monotonic; default now + timeout)."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout if deadline is None else deadline
    try:
        hello_c = first + recv_exact(sock, _HELLO.size - 4, deadline)
        _, version, flags_c, _ = _HELLO.unpack(hello_c)
        flags = (flags_c | (ENCRYPT if key.encrypt else 0)) & ENCRYPT  # either end asking for encryption gets it
        hello_s = _HELLO.pack(HELLO_MAGIC, VERSION, flags, os.urandom(NONCE_BYTES))
        transcript = hello_c + hello_s
        sock.sendall(hello_s + key.mac(b"server", transcript))
        if version != VERSION:
            raise LinkRefused(f"link handshake version {version}, this build speaks {VERSION}")
        if not hmac.compare_digest(recv_exact(sock, PROOF_BYTES, deadline), key.mac(b"client", transcript)):
            sock.sendall(b"\0")
            raise LinkRefused("the client does not hold the cluster key (its proof does not verify)")
        sock.sendall(b"\1")
    except TimeoutError:
        raise LinkRefused(f"no handshake within {timeout:.0f} s") from None
    except OSError as e:
        raise LinkRefused(f"connection lost during the handshake ({e})") from None
    finally:
        sock.settimeout(None)
    return _session(key, transcript, flags, client=False)


__all__ = ["InvalidTag", "LinkKey", "LinkRefused", "LinkTampered", "Session", "check_bind", "client_handshake",
           "recv_exact", "server_handshake"]
