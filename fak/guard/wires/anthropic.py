"""Anthropic Messages through the guard: `tool_use` blocks held until complete and adjudicated,
`tool_result` blocks admitted before the model sees them.

A stream's text and thinking blocks pass at once; a `tool_use` block (start, its `input_json_delta`
pieces, stop) is held, then emitted whole with the arguments the kernel allows, or replaced at the
same index by a text block carrying the refusal note. A message whose every call was refused ends
with stop_reason `end_turn`, not `tool_use` (the agent would wait for calls that never came).
"""

from __future__ import annotations

import json
from typing import Any

from fak.guard.sse import Event, frame
from fak.guard.state import Guard, flat_text

PATHS = ("/v1/messages", "/v1/messages/count_tokens")
NAME = "Anthropic Messages"


def offered(body: dict[str, Any]) -> frozenset[str]:
    return frozenset(t["name"] for t in body.get("tools") or [] if isinstance(t, dict) and isinstance(t.get("name"), str))


def admit_results(body: dict[str, Any], guard: Guard, trace: str) -> None:
    names: dict[Any, str] = {}
    for m in body.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            continue
        for i, blk in enumerate(content):
            if not isinstance(blk, dict):
                continue
            if blk.get("type") == "tool_use":
                names[blk.get("id")] = str(blk.get("name"))
            elif blk.get("type") == "tool_result":
                cid = blk.get("tool_use_id")
                adm = guard.result(str(cid), names.get(cid, ""), flat_text(blk.get("content")), trace)
                if adm.withheld:
                    content[i] = {**blk, "content": adm.text, "is_error": True}


class Stream:
    def __init__(self, guard: Guard, offered: frozenset[str], trace: str) -> None:
        self.guard, self.offered, self.trace = guard, offered, trace
        self.held: dict[int, tuple[dict[str, Any], list[str]]] = {}
        self.emitted_call = False

    def feed(self, ev: Event) -> list[bytes]:
        try:
            d = ev.json()
        except ValueError:
            return [frame(ev.data, ev.event)]
        t = d.get("type") if isinstance(d, dict) else None
        idx = d.get("index") if isinstance(d, dict) else None
        if t == "message_start":
            self.emitted_call = False
        elif t == "content_block_start" and (d.get("content_block") or {}).get("type") == "tool_use":
            self.held[idx] = (d["content_block"], [])
            return []
        elif t == "content_block_delta" and idx in self.held:
            self.held[idx][1].append(str((d.get("delta") or {}).get("partial_json", "")))
            return []
        elif t == "content_block_stop" and idx in self.held:
            return self._release(idx)
        elif t == "message_delta":
            delta = d.get("delta") or {}
            if delta.get("stop_reason") == "tool_use" and not self.emitted_call:
                delta["stop_reason"] = "end_turn"
        elif t == "message_stop":
            return self.close() + [frame(d, ev.event)]
        return [frame(d, ev.event)]

    def close(self) -> list[bytes]:
        """Blocks still held when the message ends never completed: refused as malformed."""
        out: list[bytes] = []
        for idx in list(self.held):
            out += self._release(idx, incomplete=True)
        return out

    def _release(self, idx: int, incomplete: bool = False) -> list[bytes]:
        block, parts = self.held.pop(idx)
        args = "".join(parts) or json.dumps(block.get("input") or {})
        adj, allowed = self.guard.call(str(block.get("name")), args, self.offered, self.trace,
                                       error="the tool_use block never completed" if incomplete else None)
        if allowed is not None:
            self.emitted_call = True
            return [frame({"type": "content_block_start", "index": idx, "content_block": {**block, "input": {}}},
                          "content_block_start"),
                    frame({"type": "content_block_delta", "index": idx,
                           "delta": {"type": "input_json_delta", "partial_json": allowed}}, "content_block_delta"),
                    frame({"type": "content_block_stop", "index": idx}, "content_block_stop")]
        return [frame({"type": "content_block_start", "index": idx, "content_block": {"type": "text", "text": ""}},
                      "content_block_start"),
                frame({"type": "content_block_delta", "index": idx, "delta": {"type": "text_delta", "text": adj.note()}},
                      "content_block_delta"),
                frame({"type": "content_block_stop", "index": idx}, "content_block_stop")]


def rewrite(obj: Any, guard: Guard, offered: frozenset[str], trace: str) -> Any:
    """A non-streamed Message with its tool_use blocks adjudicated."""
    if not isinstance(obj, dict) or not isinstance(obj.get("content"), list):
        return obj
    kept = False
    for i, blk in enumerate(obj["content"]):
        if isinstance(blk, dict) and blk.get("type") == "tool_use":
            adj, allowed = guard.call(str(blk.get("name")), json.dumps(blk.get("input", {})), offered, trace)
            if allowed is not None:
                obj["content"][i] = {**blk, "input": json.loads(allowed)}
                kept = True
            else:
                obj["content"][i] = {"type": "text", "text": adj.note()}
    if obj.get("stop_reason") == "tool_use" and not kept:
        obj["stop_reason"] = "end_turn"
    return obj


def error_body(message: str, kind: str = "api_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_frame(message: str) -> bytes:
    return frame(error_body(message), "error")
