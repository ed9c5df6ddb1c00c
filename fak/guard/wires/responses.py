"""OpenAI Responses through the guard: `function_call`, `custom_tool_call` and `local_shell_call`
output items held until done and adjudicated, their `*_output` input items admitted before the
model sees them.

Events of other items pass at once. A call item's events (added, argument deltas, done) are held;
at its `response.output_item.done` the call goes out (its events replayed, or rebuilt with the
rewritten arguments of a TRANSFORM), or a `message` item carrying the refusal note takes its
output_index. `response.completed` lists the items the agent was actually given; every event is
renumbered (`sequence_number`) since items change size.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from fak.guard.sse import Event, frame
from fak.guard.state import Guard, flat_text

PATHS = ("/v1/responses", "/v1/responses/input_tokens")
NAME = "OpenAI Responses"
CALLS = ("function_call", "custom_tool_call", "local_shell_call")
_FINAL = ("response.completed", "response.incomplete", "response.failed", "response.done")


def offered(body: dict[str, Any]) -> frozenset[str]:
    names = set()
    for t in body.get("tools") or []:
        if not isinstance(t, dict):
            continue
        if isinstance(t.get("name"), str):
            names.add(t["name"])
        elif t.get("type") == "local_shell":
            names.add("local_shell")
    return frozenset(names)


def call_of(item: dict[str, Any]) -> tuple[str, str]:
    """(tool name, arguments as JSON object text) of a call item."""
    kind = item.get("type")
    if kind == "custom_tool_call":  # freeform input (Codex's apply_patch): judged as {"input": text}
        return str(item.get("name")), json.dumps({"input": item.get("input", "")}, ensure_ascii=False)
    if kind == "local_shell_call":
        return "local_shell", json.dumps(item.get("action") or {}, ensure_ascii=False)
    return str(item.get("name")), str(item.get("arguments") or "")


def with_args(item: dict[str, Any], allowed: str) -> dict[str, Any]:
    kind = item.get("type")
    if kind == "custom_tool_call":
        return {**item, "input": json.loads(allowed).get("input", "")}
    if kind == "local_shell_call":
        return {**item, "action": json.loads(allowed)}
    return {**item, "arguments": allowed}


def admit_results(body: dict[str, Any], guard: Guard, trace: str) -> None:
    items = body.get("input")
    if not isinstance(items, list):
        return
    names: dict[Any, str] = {}
    for it in items:
        if not isinstance(it, dict):
            continue
        kind = it.get("type")
        if kind in CALLS:
            names[it.get("call_id")] = call_of(it)[0]
        elif kind in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
            cid = it.get("call_id") or it.get("id")
            adm = guard.result(str(cid), names.get(cid, ""), flat_text(it.get("output")), trace)
            if adm.withheld:
                it["output"] = adm.text


def note_item(note: str) -> dict[str, Any]:
    return {"id": f"msg_fak_{uuid.uuid4().hex[:24]}", "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": note, "annotations": []}]}


class Stream:
    def __init__(self, guard: Guard, offered: frozenset[str], trace: str) -> None:
        self.guard, self.offered, self.trace = guard, offered, trace
        self.held: dict[int, list[tuple[str | None, dict[str, Any]]]] = {}  # output_index -> its events
        self.given: dict[int, dict[str, Any]] = {}  # output_index -> the item the agent got instead
        self.seq = 0

    def _out(self, pairs: list[tuple[str | None, dict[str, Any]]]) -> list[bytes]:
        out = []
        for name, d in pairs:
            if "sequence_number" in d:
                d["sequence_number"] = self.seq
                self.seq += 1
            out.append(frame(d, name))
        return out

    def feed(self, ev: Event) -> list[bytes]:
        try:
            d = ev.json()
        except ValueError:
            return [frame(ev.data, ev.event)]
        if not isinstance(d, dict):
            return [frame(d, ev.event)]
        t, idx = d.get("type"), d.get("output_index")
        if t == "response.output_item.added" and (d.get("item") or {}).get("type") in CALLS:
            self.held[idx] = [(ev.event, d)]
            return []
        if idx in self.held and t != "response.output_item.done":
            self.held[idx].append((ev.event, d))
            return []
        if idx in self.held:
            return self._release(idx, ev.event, d)
        if t in _FINAL:
            out = self.close()
            resp = d.get("response") or {}
            if isinstance(resp.get("output"), list):
                resp["output"] = [self.given.get(i, it) for i, it in enumerate(resp["output"])]
            return out + self._out([(ev.event, d)])
        return self._out([(ev.event, d)])

    def close(self) -> list[bytes]:
        """Call items never done: refused as malformed."""
        out: list[bytes] = []
        for idx in list(self.held):
            out += self._release(idx, None, None)
        return out

    def _release(self, idx: int, name: str | None, done: dict[str, Any] | None) -> list[bytes]:
        events = self.held.pop(idx)
        item = (done or {}).get("item") or events[0][1].get("item") or {}
        tool, args = call_of(item)
        adj, allowed = self.guard.call(tool, args, self.offered, self.trace,
                                       error=None if done is not None else "the call item never completed")
        if allowed is not None and adj.verdict == "ALLOW":  # exactly what the upstream sent
            self.given[idx] = item
            return self._out([*events, (name, done)])  # type: ignore[list-item]
        if allowed is not None:  # TRANSFORM: the item rebuilt with the rewritten arguments
            given = self.given[idx] = with_args(item, allowed)
            iid, kind = given.get("id"), given.get("type")
            pairs: list[tuple[str | None, dict[str, Any]]] = [
                (events[0][0], {**events[0][1], "item": {**given, "status": "in_progress"}})]
            if kind in ("function_call", "custom_tool_call"):
                stem, key = (("response.function_call_arguments", "arguments") if kind == "function_call"
                             else ("response.custom_tool_call_input", "input"))
                base = {"item_id": iid, "output_index": idx, "sequence_number": 0}
                pairs += [(f"{stem}.delta", {"type": f"{stem}.delta", **base, "delta": given[key]}),
                          (f"{stem}.done", {"type": f"{stem}.done", **base, key: given[key]})]
            return self._out([*pairs, (name, {**(done or {}), "item": given})])
        msg = note_item(adj.note())
        self.given[idx] = msg
        text, iid = adj.note(), msg["id"]
        part = {"type": "output_text", "text": "", "annotations": []}
        base = {"item_id": iid, "output_index": idx, "content_index": 0, "sequence_number": 0}
        return self._out([
            ("response.output_item.added", {"type": "response.output_item.added", "output_index": idx, "sequence_number": 0,
                                            "item": {**msg, "status": "in_progress", "content": []}}),
            ("response.content_part.added", {"type": "response.content_part.added", **base, "part": part}),
            ("response.output_text.delta", {"type": "response.output_text.delta", **base, "delta": text, "logprobs": []}),
            ("response.output_text.done", {"type": "response.output_text.done", **base, "text": text, "logprobs": []}),
            ("response.content_part.done", {"type": "response.content_part.done", **base, "part": {**part, "text": text}}),
            ("response.output_item.done", {"type": "response.output_item.done", "output_index": idx, "sequence_number": 0,
                                           "item": msg}),
        ])


def rewrite(obj: Any, guard: Guard, offered: frozenset[str], trace: str) -> Any:
    """A non-streamed Response with its call items adjudicated."""
    if not isinstance(obj, dict) or not isinstance(obj.get("output"), list):
        return obj
    for i, item in enumerate(obj["output"]):
        if isinstance(item, dict) and item.get("type") in CALLS:
            tool, args = call_of(item)
            adj, allowed = guard.call(tool, args, offered, trace)
            obj["output"][i] = with_args(item, allowed) if allowed is not None else note_item(adj.note())
    return obj


def error_body(message: str, kind: str = "api_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def error_frame(message: str) -> bytes:
    return frame({"type": "error", "code": "upstream_error", "message": message, "param": None}, "error")
