"""Authenticated links (engine/wire/secure.py over engine/wire/channel.py): the handshake proves the key
both ways without sending it, every message is sealed, and a man in the middle (tests/support/mitm.py)
that flips a bit, replays or reorders is caught before the receiver sees a byte of it. Without a key the
same attacks go through unnoticed (the threat is real), and binding beyond loopback is refused."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from engine.wire.channel import Channel, ChannelClosed, ChannelRefused
from engine.wire.secure import LinkKey, LinkRefused, check_bind
from support import mitm
from support.paths import REPO

KEY = "a cluster key of some length 0123456789"


class _Server:
    """Accepts one connection as a node would (Channel.accept) and keeps what it received."""

    def __init__(self, key: LinkKey | None) -> None:
        self.lst = socket.create_server(("127.0.0.1", 0))
        self.port = self.lst.getsockname()[1]
        self.key = key
        self.ch: Channel | None = None
        self.error = ""
        self.ready = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        sock, addr = self.lst.accept()
        try:
            self.ch = Channel.accept(sock, "client", self.key, timeout=5.0)
        except LinkRefused as e:
            self.error = str(e)
        self.ready.set()

    def close(self) -> None:
        self.lst.close()
        if self.ch is not None:
            self.ch.close()


@contextmanager
def linked(client_key: LinkKey | None, server_key: LinkKey | None,
           attack: dict[str, Any] | None = None) -> Iterator[tuple[Channel, _Server]]:
    srv = _Server(server_key)
    port, proxy = srv.port, None
    if attack is not None:
        proxy = mitm.serve(("127.0.0.1", 0), ("127.0.0.1", srv.port), mitm.Attack(attack))
        port = proxy.getsockname()[1]
    c = Channel.connect("127.0.0.1", port, timeout=5.0, key=client_key)
    if client_key is not None:  # a plain link is accepted at its first message
        assert srv.ready.wait(10)
    try:
        yield c, srv
    finally:
        c.close()
        srv.close()
        if proxy is not None:
            proxy.close()


def _kv(seed: int, n: int = 600_000) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


@pytest.mark.parametrize("encrypt", [False, True])
def test_a_keyed_link_carries_messages_both_ways(encrypt: bool) -> None:
    with linked(LinkKey.of(KEY, encrypt), LinkKey.of(KEY)) as (c, srv):
        assert srv.ch is not None and srv.ch.session is not None and c.session is not None
        assert c.session.encrypt is encrypt and srv.ch.session.encrypt is encrypt  # either end asking gets it
        for i in range(3):
            kv = _kv(i)
            c.send({"op": "deliver", "i": i}, np.zeros(4, np.float32), kv)
            h, blobs = srv.ch.recv(10)
            assert h == {"op": "deliver", "i": i} and bytes(blobs[1]) == kv.tobytes()
            srv.ch.send({"op": "tok", "t": [i]})
            assert c.recv(10)[0] == {"op": "tok", "t": [i]}


def test_the_server_asking_for_encryption_encrypts_too() -> None:
    with linked(LinkKey.of(KEY), LinkKey.of(KEY, encrypt=True)) as (c, srv):
        assert c.session is not None and c.session.encrypt


def test_a_wrong_key_or_no_key_is_refused_at_the_handshake() -> None:
    with pytest.raises(ChannelRefused, match="does not hold the cluster key"):
        with linked(LinkKey.of("another key entirely, same length!"), LinkKey.of(KEY)):
            pass
    # a keyless client to a keyed node: the node says why, in clear, and closes
    srv = _Server(LinkKey.of(KEY))
    c = Channel.connect("127.0.0.1", srv.port, timeout=5.0)
    c.send({"op": "hello", "as": "head", "protocol": 1})
    h, _ = c.recv(5)
    assert "requires the cluster key" in h["error"]
    assert srv.ready.wait(5) and "refused a keyless client" in srv.error
    # a keyed client to a keyless node
    with pytest.raises(ChannelRefused, match="has no cluster key"):
        with linked(LinkKey.of(KEY), None):
            pass


def test_no_key_material_crosses_the_wire() -> None:
    """What a passive observer records of a handshake holds neither the key nor anything derived from it
    without a fresh nonce (the proofs are HMACs over both nonces)."""
    seen: list[bytes] = []
    real = socket.socket.sendall

    def spy(self: socket.socket, data: Any, *a: Any) -> None:
        seen.append(bytes(data))
        real(self, data, *a)

    k = LinkKey.of(KEY)
    assert k is not None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "sendall", spy)
        with linked(k, LinkKey.of(KEY)) as (c, srv):
            c.send({"op": "x"})
            assert srv.ch is not None and srv.ch.recv(5)[0] == {"op": "x"}
    wire = b"".join(seen)
    for secret in (KEY.encode(), k.secret, hashlib.sha256(KEY.encode()).digest()):
        assert secret not in wire


@pytest.mark.parametrize("encrypt", [False, True])
@pytest.mark.parametrize("action", ["flip", "replay", "reorder"])
def test_a_man_in_the_middle_is_caught_before_the_receiver_sees_anything(action: str, encrypt: bool) -> None:
    op = "*" if encrypt else "deliver"  # an encrypted header hides its op from the attacker
    with linked(LinkKey.of(KEY, encrypt), LinkKey.of(KEY), {"op": op, "action": action}) as (c, srv):
        assert srv.ch is not None
        got: list[dict[str, Any]] = []
        with pytest.raises(ChannelClosed, match="tampered with") as err:
            for i in range(3):
                c.send({"op": "deliver", "i": i}, _kv(i))
            for _ in range(4):
                h, blobs = srv.ch.recv(10)
                assert bytes(blobs[0]) == _kv(h["i"]).tobytes()  # whatever is returned is what was sent
                got.append(h)
        assert srv.ch.closed
        msg = str(err.value)
        if action == "flip":
            assert "fails its authentication tag" in msg and got == []
        elif action == "replay":
            assert "replayed" in msg and got == [{"op": "deliver", "i": 0}]  # the original, then the copy refused
        else:
            assert "out of order" in msg and got == []


def test_a_changed_length_is_refused_before_anything_is_allocated() -> None:
    """A length raised to 32 GiB on the way: the framing's own tag fails before the receiver allocates."""
    import psutil

    with linked(LinkKey.of(KEY), LinkKey.of(KEY), {"op": "deliver", "action": "length"}) as (c, srv):
        assert srv.ch is not None
        rss = psutil.Process().memory_info().rss
        c.send({"op": "deliver"}, _kv(1))
        with pytest.raises(ChannelClosed, match="framing fails its tag"):
            srv.ch.recv(10)
        assert psutil.Process().memory_info().rss - rss < 256 << 20


def test_short_keys_are_refused_long_ones_work() -> None:
    with pytest.raises(LinkRefused, match="use at least 16"):
        LinkKey.of("abc")
    long_key = "k" * 200  # past keyed BLAKE2b's 64 bytes: the frame seal has a key of its own
    k = LinkKey.of(long_key)
    assert k is not None and len(k.frame_key) == 32 and k.frame_key != k.secret
    with linked(LinkKey.of(long_key), LinkKey.of(long_key)) as (c, srv):
        c.send({"op": "x"})
        assert srv.ch is not None and srv.ch.recv(5)[0] == {"op": "x"}


def test_a_handshake_trickled_a_byte_at_a_time_is_cut_at_the_deadline() -> None:
    import time as _time

    lst = socket.create_server(("127.0.0.1", 0))
    out: dict[str, Any] = {}

    def serve() -> None:
        sock, _ = lst.accept()
        t0 = _time.monotonic()
        try:
            Channel.accept(sock, "slow", LinkKey.of(KEY), timeout=1.0)
        except LinkRefused as e:
            out["error"], out["took"] = str(e), _time.monotonic() - t0

    t = threading.Thread(target=serve)
    t.start()
    s = socket.create_connection(("127.0.0.1", lst.getsockname()[1]))
    try:
        for b in b"FAKH" + bytes(36):
            s.sendall(bytes([b]))
            _time.sleep(0.1)
            if "took" in out:
                break
    except OSError:
        pass
    t.join(10)
    s.close()
    lst.close()
    assert out["took"] < 2.0, out  # one deadline for the greeting, not one per recv


def test_a_hello_split_over_two_packets_is_still_a_hello() -> None:
    """The greeting's first 4 bytes arriving in two parts are not taken for a keyless client."""
    import time as _time

    srv = _Server(LinkKey.of(KEY))
    raw = socket.create_connection(("127.0.0.1", srv.port))
    from engine.wire import secure

    real_sendall = raw.sendall
    parts: list[bytes] = []

    class Slow:
        def __getattr__(self, name: str) -> Any:
            return getattr(raw, name)

        def sendall(self, data: bytes) -> None:
            if not parts:  # the hello: its first two bytes, a pause, the rest
                parts.append(data)
                real_sendall(data[:2])
                _time.sleep(0.3)
                real_sendall(data[2:])
            else:
                real_sendall(data)

    session = secure.client_handshake(Slow(), LinkKey.of(KEY), 5.0)  # type: ignore[arg-type]
    assert srv.ready.wait(10) and srv.ch is not None and srv.error == "" and session is not None
    raw.close()
    srv.close()


def test_a_flood_of_idle_connections_does_not_stop_a_node_accepting() -> None:
    """More idle connections than handshake slots: the extra ones are closed at once, and a key holder gets
    through once the idle ones go (the accept loop never dies)."""
    import time as _time

    from engine.wire.frame import KVLayout
    from engine.wire.node import MAX_GREETING, Node

    node = Node(object(), "n", KVLayout(1, 1, 4, 16, "<f4"), link=LinkKey.of(KEY))
    idle = [socket.create_connection(node.address) for _ in range(MAX_GREETING + 8)]
    try:
        deadline = _time.monotonic() + 10
        while node.refused < 8 and _time.monotonic() < deadline:
            _time.sleep(0.05)
        assert node.refused >= 8  # the ones past the slots, closed at once
        for s in idle:
            s.close()
        ch = Channel.connect(*node.address, timeout=10.0, key=LinkKey.of(KEY))
        assert ch.session is not None
        ch.close()
    finally:
        for s in idle:
            s.close()
        node.close()


def test_the_handshake_cannot_be_downgraded() -> None:
    """A man in the middle that clears the client's encryption flag breaks both proofs."""
    srv = _Server(LinkKey.of(KEY))
    lst = socket.create_server(("127.0.0.1", 0))

    def relay() -> None:
        a, _ = lst.accept()
        b = socket.create_connection(("127.0.0.1", srv.port))
        hello = bytearray(mitm._read(a, mitm.HELLO))
        hello[6] = 0  # flags: encryption off
        b.sendall(bytes(hello))
        threading.Thread(target=lambda: _copy(b, a), daemon=True).start()
        _copy(a, b)

    threading.Thread(target=relay, daemon=True).start()
    with pytest.raises(ChannelRefused, match="does not hold the cluster key"):
        Channel.connect("127.0.0.1", lst.getsockname()[1], timeout=5.0, key=LinkKey.of(KEY, encrypt=True))
    lst.close()
    srv.close()


def _copy(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass


def test_without_a_key_the_same_flip_goes_through_unnoticed() -> None:
    """Why the seal exists: on a plain link the receiver gets the changed bytes."""
    with linked(None, None, {"op": "deliver", "action": "flip"}) as (c, srv):
        kv = _kv(7)
        c.send({"op": "deliver"}, kv)
        assert srv.ready.wait(10) and srv.ch is not None
        _, blobs = srv.ch.recv(10)
        assert len(blobs[0]) == kv.nbytes and bytes(blobs[0]) != kv.tobytes()


def test_encryption_hides_the_payload_and_the_header() -> None:
    seen: list[bytes] = []
    real = socket.socket.sendall

    def spy(self: socket.socket, data: Any, *a: Any) -> None:
        seen.append(bytes(data))
        real(self, data, *a)

    marker = b"the prompt a tenant would rather keep" * 20
    for encrypt, visible in ((False, True), (True, False)):
        seen.clear()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(socket.socket, "sendall", spy)
            with linked(LinkKey.of(KEY, encrypt), LinkKey.of(KEY)) as (c, srv):
                c.send({"op": "prefill", "ids": "secret-ids"}, marker)
                assert srv.ch is not None and bytes(srv.ch.recv(5)[1][0]) == marker
        wire = b"".join(seen)
        assert (marker in wire) is visible and (b"secret-ids" in wire) is visible


def test_binding_beyond_loopback_without_a_key_is_refused() -> None:
    with pytest.raises(LinkRefused, match="needs the cluster key"):
        check_bind("0.0.0.0", None)
    check_bind("127.0.0.1", None)
    check_bind("0.0.0.0", LinkKey.of(KEY))
    from engine.wire.frame import KVLayout
    from engine.wire.node import Node

    with pytest.raises(LinkRefused, match="needs the cluster key"):
        Node(object(), "n", KVLayout(1, 1, 4, 16, "<f4"), host="0.0.0.0")


@pytest.mark.slow
def test_fak_worker_beyond_loopback_without_a_key_exits_2_in_one_line() -> None:
    env = {k: v for k, v in __import__("os").environ.items() if k != "FAK_PD_KEY"}
    r = subprocess.run([sys.executable, "-m", "commands.main", "worker", "--role", "decode", "--listen", "0.0.0.0:0",
                        "--gguf", "synthetic"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "needs the cluster key" in lines[0] and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "commands.main", "worker", "--role", "decode", "--link-encrypt",
                        "--gguf", "synthetic"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--link-encrypt needs the cluster key" in r.stderr
    r = subprocess.run([sys.executable, "-m", "commands.main", "worker", "--role", "decode", "--key", "short",
                        "--gguf", "synthetic"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "use at least 16" in r.stderr and "Traceback" not in r.stderr


def test_the_mitm_script_runs_standalone() -> None:
    """tests/support/mitm.py is run as a process in a namespace by the multi-host tests: it starts and says so."""
    p = subprocess.Popen([sys.executable, str(REPO / "tests" / "support" / "mitm.py"), "127.0.0.1:0", "127.0.0.1:9",
                          json.dumps({"action": "none"})], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        assert json.loads(p.stdout.readline())["mitm"] == "ready"
    finally:
        p.kill()
        p.wait(5)
