"""What one guard session keeps: the kernel, the decisions made so far (for the summary), and which
tool results were already journaled (an agent resends its whole history every turn)."""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fak.core import notes
from fak.core.abi import Reason, Result, Status, ToolCall, Verdict, VerdictKind
from fak.gateway.toolgate import Adjudication, decide


def flat_text(content: Any) -> str:
    """A tool result's text as the admitters read it, on every wire: a string, or the text parts of
    a list (any other part as its JSON), one per line; nothing for none."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    return "\n".join(p["text"] if isinstance(p, dict) and isinstance(p.get("text"), str) else json.dumps(p)
                     for p in (content if isinstance(content, list) else [content]) if p is not None)


@dataclass
class Tally:
    """Counts for the summary at exit."""

    decisions: int = 0
    allowed: int = 0
    denied: int = 0
    transformed: int = 0
    quarantined: int = 0
    results_admitted: int = 0
    results_withheld: int = 0
    reasons: Counter[str] = field(default_factory=Counter)

    def call(self, adj: Adjudication) -> None:
        self.decisions += 1
        if adj.verdict == "TRANSFORM":
            self.transformed += 1
        elif adj.verdict == "ALLOW":
            self.allowed += 1
        elif adj.verdict == "QUARANTINE":
            self.quarantined += 1
        else:
            self.denied += 1
        if not adj.emitted:
            self.reasons[adj.reason] += 1

    def result(self, v: Verdict) -> None:
        self.results_admitted += 1
        if v.kind is not VerdictKind.ALLOW:
            self.results_withheld += 1
            self.decisions += 1
            if v.kind is VerdictKind.QUARANTINE:
                self.quarantined += 1
            else:
                self.denied += 1
            self.reasons[v.reason.value] += 1

    def to_json(self) -> dict[str, Any]:
        return {"decisions": self.decisions, "allowed": self.allowed, "denied": self.denied,
                "transformed": self.transformed, "quarantined": self.quarantined,
                "results_admitted": self.results_admitted, "results_withheld": self.results_withheld,
                "top_reasons": dict(self.reasons.most_common(5))}


@dataclass
class Admitted:
    """A tool result after admission: the text the model may see, or why it was withheld."""

    verdict: Verdict
    text: str  # the original text when admitted, else the in-band note that replaces it

    @property
    def withheld(self) -> bool:
        return self.verdict.kind is not VerdictKind.ALLOW


class Guard:
    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.tally = Tally()
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], Verdict] = {}  # (call id, sha of the result) -> verdict

    @staticmethod
    def trace_id() -> str:
        return f"guard-{uuid.uuid4().hex[:16]}"

    def call(self, name: str, arguments: str, offered: frozenset[str] | None, trace_id: str,
             error: str | None = None) -> tuple[Adjudication, str | None]:
        """A proposed call through the kernel: (decision, the arguments to emit, None if refused)."""
        adj, out = decide(self.kernel, name, arguments.encode(), offered, trace_id, error=error, source="upstream")
        self.record(adj)
        return adj, out

    def record(self, adj: Adjudication) -> None:
        """Count a decision (also the in-kernel model's, made by the serving loop's ToolGate)."""
        with self._lock:
            self.tally.call(adj)

    def result(self, call_id: str, tool: str, text: str, trace_id: str) -> Admitted:
        """A tool result the agent sends back, through the result admitters; each (call, result) is
        judged and journaled once, later copies of it in the history get the same verdict."""
        key = (call_id, hashlib.sha256(text.encode()).hexdigest())
        with self._lock:
            v = self._seen.get(key)
        if v is None:
            call = ToolCall("tool", tool or "?", trace_id=trace_id, meta={"source": "agent", "call_id": call_id})
            try:
                v = self.kernel.admit(call, Result({"text": text}, Status.OK))
            except Exception as exc:  # fail closed: a result that cannot be judged is withheld
                v = Verdict.of(VerdictKind.QUARANTINE, Reason.DEFAULT_DENY, "fak:guard",
                               f"admitter error: {type(exc).__name__}: {exc}")
            with self._lock:
                if key not in self._seen:
                    self._seen[key] = v
                    self.tally.result(v)
        if v.kind is VerdictKind.ALLOW:
            return Admitted(v, text)
        note = notes.withheld(tool, v.kind.value, v.reason.value, v.detail, len(text.encode()))
        return Admitted(v, note)

