"""The kernel in the serving loop: tool calls the model proposes are parsed out of its text and
adjudicated (Kernel.submit, journaled) BEFORE the client sees them.

One ToolGate per choice. Text the parser releases passes straight on (it streams live); a call is
held by the parser until it is complete, then submitted: ALLOW -> emitted as is, TRANSFORM ->
emitted with the rewritten arguments, anything else (DENY, QUARANTINE, an unwitnessed
REQUIRE_WITNESS, a malformed call, a tool the request did not offer) -> not emitted; the client gets
a short in-band note instead (`[fak] refused Bash: POLICY_BLOCK (rm -rf ~)`). Every decision is kept
as an Adjudication, which the wires report in their `fak` extension object.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from fak.core import notes
from fak.core.abi import Reason, ToolCall, Verdict, VerdictKind
from fak.gateway.tool_parsers import Call, Text, ToolParser


@dataclass(frozen=True)
class Adjudication:
    """One decision, as the `fak` extension reports it."""

    tool: str
    args_sha256: str
    verdict: str
    reason: str
    by: str
    emitted: bool
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def note(self) -> str:
        """The in-band note that replaces a refused call: the agent shows it, the model reads it next turn."""
        return notes.refused(self.tool, self.reason, self.detail)


@dataclass(frozen=True)
class EmittedCall:
    """A call the kernel let through: what the client receives (arguments: a JSON object's text)."""

    id: str
    name: str
    arguments: str

    @property
    def input(self) -> dict[str, Any]:
        return dict(json.loads(self.arguments))


@dataclass
class ToolGate:
    parser: ToolParser  # fresh per choice
    kernel: Any  # fak.core.kernel.Kernel
    offered: frozenset[str]  # the tool names the request offered
    trace_id: str = ""
    id_prefix: str = "call_"
    adjudications: list[Adjudication] = field(default_factory=list)
    calls: list[EmittedCall] = field(default_factory=list)
    on_decision: Callable[[Adjudication], None] | None = None  # fak guard tallies the decisions

    def feed(self, delta: str) -> list[str | EmittedCall]:
        return self._pass(self.parser.feed(delta))

    def close(self) -> list[str | EmittedCall]:
        return self._pass(self.parser.close())

    def fak_extension(self) -> dict[str, Any]:
        return {"adjudications": [a.to_json() for a in self.adjudications]}

    def _pass(self, items: list[Any]) -> list[str | EmittedCall]:
        out: list[str | EmittedCall] = []
        for item in items:
            if isinstance(item, Text):
                if item.text:
                    out.append(item.text)
                continue
            emitted, note = self._adjudicate(item)
            out.append(emitted if emitted is not None else note)
        return out

    def _adjudicate(self, parsed: Call) -> tuple[EmittedCall | None, str]:
        name = parsed.name or "?"
        args = (parsed.arguments or parsed.raw or "").encode()
        adj, out = decide(self.kernel, name, args, self.offered, self.trace_id, error=parsed.error, source="model")
        self.adjudications.append(adj)
        if self.on_decision is not None:
            self.on_decision(adj)
        if out is None:
            return None, adj.note()
        emitted = EmittedCall(f"{self.id_prefix}{uuid.uuid4().hex[:24]}", name, out)
        self.calls.append(emitted)
        return emitted, ""


def decide(kernel: Any, name: str, args: bytes, offered: frozenset[str] | None, trace_id: str = "", *,
           error: str | None = None, source: str = "model") -> tuple[Adjudication, str | None]:
    """One proposed call through the kernel, failing closed: (the decision, the arguments to emit as
    JSON object text, or None when refused). `error`: the call did not parse (DENY MALFORMED); a name
    not in `offered` (None: no check) is DENY UNKNOWN_TOOL; a kernel that raises refuses the call."""
    call = ToolCall("tool", name, args=args, trace_id=trace_id, meta={"source": source})
    verdict: Verdict | None = None  # refused before the kernel, or None: the kernel decides
    if error is not None:
        verdict = Verdict.deny(Reason.MALFORMED, "fak:parser", error)
    elif offered is not None and name not in offered:
        verdict = Verdict.deny(Reason.UNKNOWN_TOOL, "fak:gateway", f"{name!r} was not offered")
    try:
        if verdict is None:
            decision = kernel.submit(call)
            verdict, call = decision.verdict, decision.call
        elif kernel.journal is not None:  # refused before the kernel: still journaled
            kernel.journal.record(call, verdict)
        out = json.dumps(json.loads(call.args), ensure_ascii=False) if verdict.allowed else None
    except Exception as exc:  # the kernel or its journal failed: nothing unjudged gets through
        verdict, out = Verdict.deny(Reason.DEFAULT_DENY, "fak:gateway", f"kernel error: {type(exc).__name__}: {exc}"), None
    passes = out is not None and verdict.kind in (VerdictKind.ALLOW, VerdictKind.TRANSFORM)
    adj = Adjudication(name, hashlib.sha256(call.args).hexdigest(), verdict.kind.value, verdict.reason.value,
                       verdict.by, passes, verdict.detail)
    return adj, out if passes else None
