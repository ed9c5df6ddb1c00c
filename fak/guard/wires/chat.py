"""OpenAI Chat Completions through the guard: `tool_calls` held until the choice finishes and
adjudicated, `role: "tool"` results admitted before the model sees them.

Content deltas pass at once. A choice's tool-call deltas (id and name first, then argument pieces)
are collected; when its finish_reason arrives, the allowed calls go out in one chunk (re-indexed
from 0) and each refused one becomes a content delta with the refusal note. A choice whose every
call was refused finishes with `stop`, not `tool_calls`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fak.guard.sse import Event, frame
from fak.guard.state import Guard, flat_text

PATHS = ("/v1/chat/completions",)
NAME = "OpenAI Chat"


def offered(body: dict[str, Any]) -> frozenset[str]:
    names = set()
    for t in body.get("tools") or []:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.add(fn["name"])
    for fn in body.get("functions") or []:  # the deprecated spelling
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.add(fn["name"])
    return frozenset(names)


def admit_results(body: dict[str, Any], guard: Guard, trace: str) -> None:
    names: dict[Any, str] = {}
    for m in body.get("messages") or []:
        if not isinstance(m, dict):
            continue
        for tc in m.get("tool_calls") or []:
            if isinstance(tc, dict):
                names[tc.get("id")] = str((tc.get("function") or {}).get("name"))
        if m.get("role") == "tool":
            cid = m.get("tool_call_id")
            adm = guard.result(str(cid), names.get(cid, ""), flat_text(m.get("content")), trace)
            if adm.withheld:
                m["content"] = adm.text


@dataclass
class _Pending:
    id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)


class Stream:
    def __init__(self, guard: Guard, offered: frozenset[str], trace: str) -> None:
        self.guard, self.offered, self.trace = guard, offered, trace
        self.pending: dict[int, dict[int, _Pending]] = {}  # choice -> tool-call index -> call
        self.last: dict[str, Any] = {}  # the envelope (id, object, created, model) of the latest chunk

    def feed(self, ev: Event) -> list[bytes]:
        if ev.data.strip() == "[DONE]":
            return self.close() + [frame("[DONE]")]
        try:
            d = ev.json()
        except ValueError:
            return [frame(ev.data, ev.event)]
        if not isinstance(d, dict) or not isinstance(d.get("choices"), list):
            return [frame(d, ev.event)]
        self.last = {k: d[k] for k in ("id", "object", "created", "model", "system_fingerprint") if k in d}
        out: list[bytes] = []
        for ch in d["choices"]:
            delta = ch.get("delta") or {}
            for tc in delta.pop("tool_calls", None) or []:
                p = self.pending.setdefault(ch.get("index", 0), {}).setdefault(tc.get("index", 0), _Pending())
                fn = tc.get("function") or {}
                p.id = tc.get("id") or p.id
                p.name = fn.get("name") or p.name
                p.parts.append(fn.get("arguments") or "")
            if ch.get("finish_reason") is not None:
                out += self._release(ch.get("index", 0), ch)
        d["choices"] = [ch for ch in d["choices"] if ch.get("finish_reason") is not None or _has(ch.get("delta"))]
        if d["choices"] or "usage" in d and d["usage"] is not None:
            # the released calls go out before the chunk that finishes their choice
            out.append(frame(d, ev.event))
        return out

    def close(self) -> list[bytes]:
        """Calls of a choice that never finished: refused as malformed."""
        out: list[bytes] = []
        for idx in list(self.pending):
            out += self._release(idx, None)
        return out

    def _release(self, idx: int, finishing: dict[str, Any] | None) -> list[bytes]:
        calls = self.pending.pop(idx, {})
        if not calls:
            return []
        emitted, notes = [], []
        for _, p in sorted(calls.items()):
            adj, allowed = self.guard.call(p.name, "".join(p.parts), self.offered, self.trace,
                                           error=None if finishing is not None else "the tool call never completed")
            if allowed is not None:
                emitted.append({"index": len(emitted), "id": p.id, "type": "function",
                                "function": {"name": p.name, "arguments": allowed}})
            else:
                notes.append(adj.note())
        delta: dict[str, Any] = {}
        if notes:
            delta["content"] = "\n".join(notes)
        if emitted:
            delta["tool_calls"] = emitted
        if finishing is not None and finishing.get("finish_reason") == "tool_calls" and not emitted:
            finishing["finish_reason"] = "stop"
        return [frame({**self.last, "choices": [{"index": idx, "delta": delta, "finish_reason": None}]})]


def _has(delta: Any) -> bool:
    return isinstance(delta, dict) and any(v not in (None, "", []) for v in delta.values())


def rewrite(obj: Any, guard: Guard, offered: frozenset[str], trace: str) -> Any:
    """A non-streamed completion with each choice's tool_calls adjudicated."""
    if not isinstance(obj, dict):
        return obj
    for ch in obj.get("choices") or []:
        msg = ch.get("message") or {}
        calls = msg.get("tool_calls")
        if not calls:
            continue
        kept, notes = [], []
        for tc in calls:
            fn = tc.get("function") or {}
            adj, allowed = guard.call(str(fn.get("name")), str(fn.get("arguments") or ""), offered, trace)
            if allowed is not None:
                kept.append({**tc, "function": {**fn, "arguments": allowed}})
            else:
                notes.append(adj.note())
        msg["tool_calls"] = kept or None
        if notes:
            msg["content"] = "\n".join(x for x in [msg.get("content") or "", *notes] if x)
        if ch.get("finish_reason") == "tool_calls" and not kept:
            ch["finish_reason"] = "stop"
    return obj


def error_body(message: str, kind: str = "api_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def error_frame(message: str) -> bytes:
    return frame(error_body(message))
