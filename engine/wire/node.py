"""Node: a P/D worker as a server process (`fak worker --role prefill|decode --listen HOST:PORT`).

A node listens on TCP; with a cluster key (`link`) every connection first passes the key handshake
(engine/wire/secure.py) and every message is sealed, and without one the node refuses to listen beyond
loopback. Every connection is a Channel whose first message is a hello saying who connects
("head": the serving process that routes and streams; "prefill": a prefill node bringing KV). The node
answers with its role, name, model identity and KV layout, so a head refuses a worker loaded with another
model before any block moves. One thread per connection reads messages and calls `handle(op, ...)`;
a heartbeat thread sends the node's stats to the head every `beat_s` (the head's liveness signal too).

The worker objects (engine/pd/workers.py) are hosted unchanged: a node only adds the wire around them,
so the same workers can be hosted by another supervisor (the Ray issue) without change.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from dataclasses import asdict
from typing import Any

from engine.wire.channel import Channel, ChannelClosed
from engine.wire.frame import KVLayout
from engine.wire.secure import LinkKey, LinkRefused, check_bind
from engine.wire.transport import TransportTimeout

PROTOCOL = 1
MAX_GREETING = 64  # connections at once still in their handshake (each bounded by its deadline)


class Node:
    role = "node"

    def __init__(self, model: Any, name: str, layout: KVLayout, host: str = "127.0.0.1", port: int = 0,
                 beat_s: float = 0.5, link: LinkKey | None = None) -> None:
        check_bind(host, link)
        self.model = model
        self.link = link
        self.refused = 0  # connections that failed the handshake (no key, a wrong one, not a fak peer)
        self._greeting = threading.BoundedSemaphore(MAX_GREETING)
        self.name = name
        self.layout = layout
        self.beat_s = beat_s
        self.head: Channel | None = None
        self._stop = threading.Event()
        self._listener = socket.create_server((host, port))
        bound = self._listener.getsockname()
        self.address = (str(bound[0]), int(bound[1]))
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept, "accept")
        self._spawn(self._beat, "beat")

    def _spawn(self, fn: Any, what: str, *args: Any) -> None:
        t = threading.Thread(target=fn, args=args, name=f"fak-{self.name}-{what}", daemon=True)
        t.start()
        self._threads = [x for x in self._threads if x.is_alive()] + [t]  # connections come and go

    # ------------------------------------------------------------------ what a subclass provides
    def hello(self) -> dict[str, Any]:
        """Extra fields of the hello reply."""
        return {}

    def handle(self, ch: Channel, header: dict[str, Any], blobs: list[memoryview]) -> None:
        raise NotImplementedError

    def beat(self) -> dict[str, Any]:
        """The stats message sent to the head every beat_s."""
        return {}

    def head_lost(self) -> None:
        """The head's connection closed (it restarts or reconnects; in-flight work is the head's to resume)."""

    def link_lost(self, who: str, why: str) -> None:
        """A connection from a peer other than the head broke (closed, cut, or failed its seal)."""

    def close_workers(self) -> None:
        pass

    # ------------------------------------------------------------------ plumbing
    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                sock, addr = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as e:
                if self._stop.is_set() or e.errno == errno.EBADF:  # closed: the node is stopping
                    return
                time.sleep(0.1)  # out of descriptors or memory (a flood): keep accepting once it passes
                continue
            if not self._greeting.acquire(blocking=False):  # too many connections not yet through the handshake
                self.refused += 1
                sock.close()
                continue
            sock.settimeout(None)
            try:
                self._spawn(self._serve, "conn", sock, f"{addr[0]}:{addr[1]}")
            except RuntimeError:  # no thread to serve it
                self._greeting.release()
                sock.close()

    def _serve(self, sock: socket.socket, peer: str) -> None:
        try:
            ch = Channel.accept(sock, peer, self.link)
        except LinkRefused:
            self.refused += 1
            return
        finally:
            self._greeting.release()
        try:
            header, _ = ch.recv(30.0)
        except (ChannelClosed, TransportTimeout):
            ch.close()
            return
        if header.get("op") != "hello":
            ch.close()
            return
        who = header.get("as")
        ch.peer = f"{who}@{ch.peer}"
        reply = {"op": "hello", "protocol": PROTOCOL, "role": self.role, "name": self.name,
                 "identity": self.model.identity.hex(), "layout": asdict(self.layout), "pid": os.getpid(),
                 **self.hello()}
        if header.get("protocol") != PROTOCOL:
            ch.send({**reply, "error": f"protocol {header.get('protocol')} is not {PROTOCOL}"})
            ch.close()
            return
        try:
            self.greet(ch, header, reply)
        except Exception as e:  # a bad hello is the peer's error, reported, never the node's crash
            ch.send({**reply, "error": f"{type(e).__name__}: {e}"})
            ch.close()
            return
        if who == "probe":  # asked who we are (a head sorting --pd-workers by role): answered, done
            ch.close()
            return
        if who == "head":
            old, self.head = self.head, ch
            if old is not None:
                old.close()
        try:
            while not self._stop.is_set():
                try:
                    header, blobs = ch.recv(0.5)
                except TransportTimeout:
                    continue
                if header.get("op") == "shutdown":
                    self._stop.set()
                    break
                if header.get("op") == "bye":  # the peer ends this connection on purpose
                    break
                self.handle(ch, header, blobs)
        except ChannelClosed as e:
            if who != "head" and not self._stop.is_set():
                self.link_lost(str(who), str(e))
        finally:
            if self.head is ch:
                self.head = None
                self.head_lost()
            ch.close()

    def greet(self, ch: Channel, header: dict[str, Any], reply: dict[str, Any]) -> None:
        """Answer a hello (a subclass may set up a link first and add to the reply)."""
        ch.send(reply)


    def send_head(self, header: dict[str, Any], *blobs: Any) -> bool:
        ch = self.head
        if ch is None:
            return False
        try:
            ch.send(header, *blobs)
            return True
        except ChannelClosed:
            return False

    def _beat(self) -> None:
        while not self._stop.wait(self.beat_s):
            if self.head is not None:
                try:
                    self.send_head({"op": "stats", "t": time.time(), **self.beat()})
                except Exception:  # a stats read must never stop the heartbeat
                    pass

    def serve_forever(self) -> None:
        self._stop.wait()
        self.close()

    def close(self) -> None:
        self._stop.set()
        try:
            self._listener.close()
        except OSError:
            pass
        if self.head is not None:
            self.head.close()
        self.close_workers()


def probe(address: str, timeout: float = 10.0, key: LinkKey | None = None) -> dict[str, Any]:
    """A worker's hello (role, name, model identity, layout) without becoming its head."""
    from engine.wire.channel import parse_address

    host, port = parse_address(address, "worker address")
    ch = Channel.connect(host, port, timeout=timeout, peer=address, key=key)
    try:
        ch.send({"op": "hello", "as": "probe", "protocol": PROTOCOL})
        hello, _ = ch.recv(timeout)
        if hello.get("error"):  # e.g. a keyed worker asked without the key
            raise LinkRefused(f"{address}: {hello['error']}")
        return hello
    finally:
        ch.close()
