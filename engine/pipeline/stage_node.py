"""StageNode: a pipeline Stage served over the wire (`fak worker --role stage --layers LO:HI`).

Connections (engine/wire/node.py hellos):
    head      control: `pool` (reset the KV pool to the head's budget), `inbound` / `outbound` (set up the
              links), `read` / `write` / `copy` (swap and copy-on-write on this stage's blocks), `info`
    upstream  forward messages from the head (stage 1) or the previous stage, over TCP
    sink      the head's connection the last stage sends its results on (TCP)
With shm the inbound is this node's ring and the outbound the next stage's (or the head's) ring.
"""

from __future__ import annotations

import threading
from typing import Any

from engine.errors import EngineError
from engine.pipeline.stage import Stage, serve
from engine.wire.channel import Channel, parse_address
from engine.wire.frame import KVLayout
from engine.wire.link import ChannelLink, RingReceiver, RingSender
from engine.wire.node import PROTOCOL, Node
from engine.wire.secure import LinkKey


class _Later:
    """The outbound link, once the head has said where it goes (messages may not arrive before that)."""

    def __init__(self) -> None:
        self.link: Any = None
        self.ready = threading.Event()

    def set(self, link: Any) -> None:
        old, self.link = self.link, link
        self.ready.set()
        if old is not None:
            old.close()

    def send(self, header: dict[str, Any], blob: Any) -> None:
        if not self.ready.wait(60):
            raise EngineError("stage: no outbound link configured")
        self.link.send(header, blob)


class StageNode(Node):
    role = "stage"

    def __init__(self, model: Any, lo: int, hi: int, name: str | None = None, *, host: str = "127.0.0.1",
                 port: int = 0, beat_s: float = 0.5, link: LinkKey | None = None) -> None:
        self.stage = Stage(model, lo, hi)
        self.out = _Later()
        self._ring: RingReceiver | None = None
        self._ring_stop = threading.Event()
        self._ring_thread: threading.Thread | None = None
        super().__init__(model, name or f"stage-{lo}-{hi}", KVLayout.of(self.stage.pools[0]), host, port, beat_s, link)

    def hello(self) -> dict[str, Any]:
        return {"layers": [self.stage.lo, self.stage.hi]}

    def greet(self, ch: Channel, header: dict[str, Any], reply: dict[str, Any]) -> None:
        ch.send(reply)
        who = header.get("as")
        if who == "upstream":  # this connection is our inbound: run the stage loop on it until it closes
            serve(self.stage, ChannelLink(ch), self.out, self._stop)
        elif who == "sink":
            self.out.set(ChannelLink(ch))

    def handle(self, ch: Channel, header: dict[str, Any], blobs: list[memoryview]) -> None:
        op, rid = header.get("op"), header.get("id")
        try:
            extra: dict[str, Any] = {}
            blob = None
            if op == "pool":
                nb = header.get("num_blocks")
                extra = {"block_bytes": self.stage.reset_pool(int(header.get("pool", 0)), None if nb is None else int(nb),
                                                              int(header["block_tokens"]), int(header.get("gen", 0)))}
            elif op == "inbound":
                if header.get("transport") == "shm":
                    self._open_ring(int(header.get("ring_bytes") or 64 << 20))
                    extra = {"ring": self._ring.name}  # type: ignore[union-attr]
            elif op == "outbound":
                nxt = header.get("next")
                if header.get("transport") == "shm":
                    self.out.set(RingSender(str(nxt)))
                elif nxt:  # tcp to the next stage, as its upstream; None: the head's sink connection comes
                    host, port = parse_address(str(nxt), "next stage")
                    down = Channel.connect(host, port, peer=f"stage {nxt}", key=self.link)
                    down.send({"op": "hello", "as": "upstream", "protocol": PROTOCOL})
                    down.recv(30.0)
                    self.out.set(ChannelLink(down))
            elif op == "read":
                blob = self.stage.read(int(header.get("pool", 0)), [int(b) for b in header["blocks"]])
            elif op == "write":
                self.stage.write(int(header.get("pool", 0)), [int(b) for b in header["blocks"]], blobs[0])
            elif op == "copy":
                self.stage.copy(int(header.get("pool", 0)), int(header["src"]), int(header["dst"]))
            elif op == "info":
                extra = {"info": self.stage.info()}
            else:
                raise EngineError(f"unknown op {op!r}")
        except Exception as e:
            ch.send({"op": "reply", "id": rid, "error": f"{type(e).__name__}: {e}"})
            return
        if blob is None:
            ch.send({"op": "reply", "id": rid, **extra})
        else:
            ch.send({"op": "reply", "id": rid, **extra}, blob)

    def _open_ring(self, size: int) -> None:
        """This node's inbound ring, one for its life: when the head re-links (a neighbour was replaced) the
        loop reading it stops, the ring drops what the old sender left, and a new loop starts."""
        if self._ring is None:
            self._ring = RingReceiver(size)
        else:
            self._ring_stop.set()
            if self._ring_thread is not None:
                self._ring_thread.join(5)
            self._ring.reset()
        self._ring_stop = threading.Event()
        self._ring_thread = threading.Thread(target=serve, args=(self.stage, self._ring, self.out, self._ring_stop),
                                             name=f"fak-{self.name}-ring", daemon=True)
        self._ring_thread.start()

    def beat(self) -> dict[str, Any]:
        return {"info": self.stage.info()}

    def close_workers(self) -> None:
        if self.out.link is not None:
            self.out.link.close()
        if self._ring is not None:
            self._ring_stop.set()
            if self._ring_thread is not None:
                self._ring_thread.join(2)
            self._ring.close()
