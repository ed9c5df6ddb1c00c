"""Trace files and their replay through the kernel (no rendering here: commands/run_trace.py renders).

A trace is `{"trace_id"?: str, "calls": [{"tool": str, "args": {...}, "meta"?: {...}, "engine"?: str,
"op"?: str, "args_raw"?: str}]}`. `args_raw` (a string sent as-is) lets a trace exercise MALFORMED.
During replay `meta["witness"]` ("confirmed"/"refuted") answers REQUIRE_WITNESS (MetaWitness), and
the mock engine replies with `meta["mock_reply"]` when given.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fak.core.abi import Result, ToolCall, Verdict
from fak.core.journal import Journal
from fak.core.jsonfile import read_json
from fak.core.kernel import Kernel, MetaWitness
from fak.core.policy import Policy, coding_floor, load_policy
from fak.errors import FakError


@dataclass
class TraceCall:
    tool: str
    args: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)
    engine: str | None = None
    op: str = "tool"
    args_raw: bytes | None = None

    def to_call(self, trace_id: str) -> ToolCall:
        if self.args_raw is not None:
            return ToolCall(self.op, self.tool, self.engine, self.args_raw, frozenset(), trace_id, -1, dict(self.meta))
        return ToolCall.from_args(self.tool, self.args, op=self.op, engine=self.engine, trace_id=trace_id, meta=self.meta)


@dataclass
class Trace:
    source: str
    trace_id: str
    calls: list[TraceCall]


def parse_trace(obj: Any, source: str = "<trace>") -> Trace:
    def fail(where: str, problem: str) -> FakError:
        return FakError(f"{source}: {where}: {problem}")

    if not isinstance(obj, dict) or not isinstance(obj.get("calls"), list):
        raise FakError(f"{source}: a trace must be a JSON object with a 'calls' list")
    trace_id = obj.get("trace_id", Path(source).stem)
    if not isinstance(trace_id, str):
        raise fail("trace_id", "expected a string")
    calls: list[TraceCall] = []
    for i, c in enumerate(obj["calls"]):
        where = f"calls[{i}]"
        if not isinstance(c, dict):
            raise fail(where, "expected an object")
        try:  # JSON may spell a lone surrogate (\udcff): no UTF-8 argument bytes can carry it
            json.dumps(c, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise fail(where, f"text is not valid Unicode (lone surrogate {exc.object[exc.start]!r})") from None
        tool = c.get("tool")
        if not isinstance(tool, str) or not tool:
            raise fail(f"{where}.tool", "expected a non-empty string")
        args = c.get("args", {})
        if not isinstance(args, dict):
            raise fail(f"{where}.args", "expected an object")
        meta = c.get("meta", {})
        if not isinstance(meta, dict):
            raise fail(f"{where}.meta", "expected an object")
        engine = c.get("engine")
        if engine is not None and (not isinstance(engine, str) or not engine):
            raise fail(f"{where}.engine", "expected an engine id string")
        op = c.get("op", "tool")
        if not isinstance(op, str):
            raise fail(f"{where}.op", "expected a string")
        raw = c.get("args_raw")
        if raw is not None and not isinstance(raw, str):
            raise fail(f"{where}.args_raw", "expected a string")
        calls.append(TraceCall(tool, args, meta, engine, op, raw.encode() if raw is not None else None))
    return Trace(source, trace_id, calls)


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a trace file; a call naming an engine that is not registered is bad input, like a bad field."""
    from fak.core.registry import known_engines

    trace = parse_trace(read_json(path, "trace"), str(path))
    known = known_engines()
    for i, c in enumerate(trace.calls):
        if c.engine is not None and c.engine not in known:
            raise FakError(f"{trace.source}: calls[{i}].engine: unknown engine {c.engine!r} (known: {', '.join(known)})")
    return trace


@dataclass
class Row:
    index: int
    tool: str
    verdict: str
    reason: str
    by: str
    status: str
    detail: str = ""

    def public(self) -> dict[str, str]:
        """The --json shape of one call."""
        return {"tool": self.tool, "verdict": self.verdict, "reason": self.reason, "by": self.by, "status": self.status}


@dataclass
class Replay:
    rows: list[Row]
    summary: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"calls": [r.public() for r in self.rows], "summary": self.summary}


def build_kernel(
    engine: str = "mock",
    policy: Policy | str | os.PathLike[str] | None = None,
    journal: str | os.PathLike[str] | None = None,
    engine_opts: dict[str, dict[str, Any]] | None = None,
) -> Kernel:
    """The replay kernel: policy (default: the coding floor), MetaWitness, optional journal; the default
    engine is built now so an unknown id or a bad engine config fails before any call."""
    pol = policy if isinstance(policy, Policy) else coding_floor() if policy is None else load_policy(policy)
    kernel = Kernel.with_policy(pol, witnesses=[MetaWitness()], default_engine=engine, engine_opts=engine_opts)
    kernel.engine_for(engine)
    if journal is not None:
        kernel.journal = Journal(journal)
    return kernel


def replay(trace: Trace, kernel: Kernel) -> Replay:
    rows: list[Row] = []
    for i, tc in enumerate(trace.calls):
        res = kernel.syscall(tc.to_call(trace.trace_id))
        v: Verdict = res.meta.get("result_verdict") or res.meta["verdict"]
        rows.append(Row(i, tc.tool, v.kind.value, v.reason.value, v.by, _status(res), v.detail))
    s = kernel.stats()
    summary = {k: s[k] for k in ("submits", "engine_calls", "denies", "transforms", "quarantines", "result_denies")}
    return Replay(rows, summary)


def _status(res: Result) -> str:
    return res.status.value
