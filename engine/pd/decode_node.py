"""DecodeNode: a DecodeWorker served over the P/D wire (engine/wire/node.py).

From the head: `reserve` (the leading prompt blocks this worker holds, one reference each kept for the
delivery), `release`, `cancel`. From a prefill node: deliveries (header + logits + KV frame) over a TCP
channel or this node's shared-memory ring; each is imported and admitted straight into decoding, and its
tokens (ids and logprobs; the head detokenizes) stream to the head as `tok` events, then one `done`.
The prefix cache's add/evict events go to the head too (its router's residency view).

If the head goes away its lanes are cancelled (their KV freed): a head that comes back resumes its
requests itself (prompt + tokens so far), so nothing here outlives the connection that asked for it.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import numpy as np

from engine.model.kv import KVLost
from engine.pd.workers import DecodeWorker, Delivery
from engine.sched.lane import Handle
from engine.wire.channel import Channel
from engine.wire.link import DataReceiver, ShmDataReceiver
from engine.wire.node import Node
from engine.wire.secure import LinkKey
from engine.wire.spec import logprob_to_json, request_from_json
from engine.wire.transport import TransportClosed, TransportTimeout


class DecodeNode(Node):
    role = "decode"

    def __init__(self, model: Any, name: str = "decode-0", *, host: str = "127.0.0.1", port: int = 0,
                 shm_bytes: int = 256 << 20, key: bytes = b"", beat_s: float = 0.5, link: LinkKey | None = None,
                 **sched_kwargs: Any) -> None:
        self._events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.worker = DecodeWorker(model, name, key=key, listener=lambda kind, hs: self._events.put(("cache", kind, hs)),
                                   **sched_kwargs)
        self.shm_bytes = shm_bytes
        self._lanes: dict[str, list[Any]] = {}  # rid -> [handle, event cursor, logprob cursor]
        self._lanes_lock = threading.Lock()
        self._rings: list[ShmDataReceiver] = []
        super().__init__(model, name, self.worker.layout, host, port, beat_s, link)
        self._spawn(self._forward, "events")

    # ------------------------------------------------------------------ wire
    def greet(self, ch: Channel, header: dict[str, Any], reply: dict[str, Any]) -> None:
        if header.get("as") == "prefill" and header.get("shm"):
            ring = ShmDataReceiver(int(header.get("shm_bytes") or self.shm_bytes))
            self._rings.append(ring)
            self._spawn(self._read_ring, "ring", ring)
            reply = {**reply, "shm": ring.name}
        ch.send(reply)

    def handle(self, ch: Channel, header: dict[str, Any], blobs: list[memoryview]) -> None:
        op = header.get("op")
        if op == "deliver":
            self._deliver(header, np.frombuffer(blobs[0], dtype=np.float32).copy(), blobs[1])
        elif op == "reserve":
            held = self.worker.reserve([int(t) for t in header["ids"]], str(header.get("scope", "")))
            ch.send({"op": "reply", "id": header["id"], "held": held})
        elif op == "release":
            self.worker.release([int(b) for b in header.get("blocks", ())])
        elif op == "cancel":
            with self._lanes_lock:
                lane = self._lanes.get(str(header.get("rid")))
            if lane is not None:
                lane[0].cancel()

    def _read_ring(self, ring: DataReceiver) -> None:
        while not self._stop.is_set():
            try:
                header, logits, frame = ring.recv(0.2)
            except TransportTimeout:
                continue
            except TransportClosed:
                return
            self._deliver(header, logits, frame)

    def _deliver(self, header: dict[str, Any], logits: np.ndarray, frame: memoryview) -> None:
        rid = str(header["rid"])
        try:
            ids = [int(t) for t in header["ids"]]
            request = request_from_json(header["spec"], ids)
            d = Delivery(request, ids, [int(b) for b in header.get("held", ())], logits)
            handle = self.worker.deliver(d, frame)
        except Exception as e:  # refused frame, no room, bad request: the head fails it; a lost stage: re-routes it
            self.send_head({"op": "done", "rid": rid, "finish": "error", "ids": [], "retry": isinstance(e, KVLost),
                            "error": f"{self.name}: KV import failed: {type(e).__name__}: {e}"})
            return
        with self._lanes_lock:
            self._lanes[rid] = [handle, 0, 0]
        handle.watch(lambda: self._events.put(("lane", rid)))

    # ------------------------------------------------------------------ events to the head (one thread)
    def _forward(self) -> None:
        while not self._stop.is_set():
            try:
                item = self._events.get(timeout=0.2)
            except queue.Empty:
                continue
            if item[0] == "cache":
                self.send_head({"op": "cache", "kind": item[1], "h": list(item[2])})
                continue
            if item[0] == "link_lost":  # with the requests this node holds: the others' deliveries are lost
                with self._lanes_lock:
                    held = list(self._lanes)
                self.send_head({"op": "link_lost", "from": item[1], "error": item[2], "lanes": held})
                continue
            rid = item[1]
            with self._lanes_lock:
                lane = self._lanes.get(rid)
            if lane is None:
                continue
            handle: Handle = lane[0]
            events, result = handle.snapshot(lane[1])
            lane[1] += len(events)
            toks = [t for t, _ in events if t >= 0]
            if toks:
                msg: dict[str, Any] = {"op": "tok", "rid": rid, "t": toks}
                if handle.request.logprobs is not None:
                    lps = handle.logprobs[lane[2] : lane[2] + len(toks)]
                    lane[2] += len(lps)
                    msg["lp"] = [logprob_to_json(lp) for lp in lps]
                self.send_head(msg)
            if result is not None:
                with self._lanes_lock:
                    self._lanes.pop(rid, None)
                self.send_head({"op": "done", "rid": rid, "finish": result.finish_reason.value, "error": result.error,
                                "ids": result.token_ids, "preemptions": result.preemptions})

    def beat(self) -> dict[str, Any]:
        w = self.worker
        with self._lanes_lock:
            lanes = len(self._lanes)
        return {"sched": w.sched.stats().to_json(), "worker": dict(w.stats), "transfer_s": w.transfer_s,
                "lanes": lanes}

    def link_lost(self, who: str, why: str) -> None:
        # deliveries the prefill node sent on that link may never arrive (a tampered one is dropped unread):
        # the head resumes this node's requests elsewhere and re-links it
        if who == "prefill":
            self._events.put(("link_lost", who, why))  # after the lane events already queued

    def head_lost(self) -> None:
        with self._lanes_lock:
            lanes = list(self._lanes.values())
        for lane in lanes:
            lane[0].cancel()

    def close_workers(self) -> None:
        for t in self._threads:  # the ring readers see _stop within one recv timeout
            if t.name.endswith("-ring"):
                t.join(2)
        for ring in self._rings:
            ring.close()
        self.worker.close()
