"""PrefillNode: a PrefillWorker served over the P/D wire (engine/wire/node.py).

The head says which decode nodes exist (`link`: name, address, shm or tcp); the node connects to each as
"prefill" and keeps a DataSender per link. A `prefill` message (prompt ids, the request's spec, the
target decode node and the blocks it reserved) is queued on the worker's thread; the new blocks go
straight to the target (never through the head), then the head hears `prefilled` or `failed` (with
`link: true` when the target could not be reached, so the head re-routes instead of failing).
"""

from __future__ import annotations

import threading
from typing import Any

from engine.pd.workers import PrefillWorker
from engine.sched.trust import KVDescriptor
from engine.wire.channel import Channel, parse_address
from engine.wire.frame import KVLayout
from engine.wire.link import ChannelSender, DataSender, ShmDataSender
from engine.wire.node import PROTOCOL, Node
from engine.wire.secure import LinkKey
from engine.wire.transport import TransportError


class PrefillNode(Node):
    role = "prefill"

    def __init__(self, model: Any, name: str = "prefill-0", *, host: str = "127.0.0.1", port: int = 0,
                 key: bytes = b"", beat_s: float = 0.5, link: LinkKey | None = None, **prefill_kwargs: Any) -> None:
        self.worker = PrefillWorker(model, key=key, **prefill_kwargs)
        self._links: dict[str, DataSender] = {}
        self._links_lock = threading.Lock()
        self._shm_control: list[Channel] = []  # an shm link's TCP connection stays open: the decode node's view of us
        super().__init__(model, name, KVLayout.of(self.worker.pool), host, port, beat_s, link)

    def handle(self, ch: Channel, header: dict[str, Any], blobs: list[memoryview]) -> None:
        op = header.get("op")
        if op == "link":
            try:
                self._link(str(header["name"]), str(header["address"]), bool(header.get("shm")),
                           int(header.get("shm_bytes") or 0))
                ch.send({"op": "reply", "id": header["id"]})
            except Exception as e:
                ch.send({"op": "reply", "id": header["id"], "error": f"{type(e).__name__}: {e}"})
        elif op == "unlink":
            with self._links_lock:
                link = self._links.pop(str(header["name"]), None)
            if link is not None:
                link.close()
        elif op == "prefill":
            try:
                self.worker.submit(lambda: self._prefill(header))
            except Exception as e:
                self.send_head({"op": "failed", "rid": header.get("rid"), "error": str(e), "link": False})

    def _link(self, name: str, address: str, shm: bool, shm_bytes: int) -> None:
        host, port = parse_address(address, f"decode worker {name}")
        ch = Channel.connect(host, port, peer=f"decode {name}", key=self.link)
        ch.send({"op": "hello", "as": "prefill", "protocol": PROTOCOL, "shm": shm, "shm_bytes": shm_bytes})
        reply, _ = ch.recv(30.0)
        if reply.get("error"):
            ch.close()
            raise TransportError(f"decode worker {name} at {address} refused the link: {reply['error']}")
        if reply.get("identity") != self.model.identity.hex():
            ch.close()
            raise TransportError(f"decode worker {name} at {address} serves another model")
        link: DataSender = ChannelSender(ch)
        if shm:
            link = ShmDataSender(str(reply["shm"]))
            self._shm_control.append(ch)
        with self._links_lock:
            old, self._links[name] = self._links.get(name), link
        if old is not None:
            old.close()

    def _prefill(self, h: dict[str, Any]) -> None:
        rid, target = h["rid"], str(h["target"])
        spec = h["spec"]
        held = [int(b) for b in h.get("held", ())]
        ids = [int(t) for t in h["ids"]]
        try:
            res = self.worker.prefill(ids, KVDescriptor(str(spec.get("scope", "")), bool(spec.get("tainted")),
                                                        str(spec.get("verdict", "ALLOW"))), len(held))
        except Exception as e:
            self.send_head({"op": "failed", "rid": rid, "error": f"prefill failed: {type(e).__name__}: {e}",
                            "link": False})
            return
        with self._links_lock:
            link = self._links.get(target)
        try:
            if link is None:
                raise TransportError(f"no link to decode worker {target}")
            link.send({"rid": rid, "spec": spec, "ids": ids, "held": held}, res.logits, res.frame, 30.0)
        except Exception as e:
            self.send_head({"op": "failed", "rid": rid, "error": f"KV transfer to {target} failed: {e}", "link": True})
            return
        self.send_head({"op": "prefilled", "rid": rid, "target": target, "blocks": res.blocks,
                        "bytes": len(memoryview(res.frame).cast("B")), "skip": res.skip,
                        "computed": res.computed_tokens})

    def beat(self) -> dict[str, Any]:
        return {"worker": dict(self.worker.stats)}

    def close_workers(self) -> None:
        with self._links_lock:
            links, self._links = list(self._links.values()), {}
        for link in links:
            link.close()
        for ch in self._shm_control:
            ch.close()
        self.worker.close()
