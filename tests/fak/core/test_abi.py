"""ABI: enums and their mapping, ToolCall argument caching, Result helpers, the engine protocols."""

from __future__ import annotations

import json

import pytest

from fak.core.abi import (
    RANK,
    Disposition,
    EngineDriver,
    EngineRequest,
    LifecycleEngine,
    Reason,
    Result,
    Status,
    ToolCall,
    Verdict,
    VerdictKind,
    disposition_for,
)


def test_kinds_and_reasons() -> None:
    assert {k.value for k in VerdictKind} == {
        "ALLOW", "DENY", "TRANSFORM", "QUARANTINE", "REQUIRE_WITNESS", "DEFER", "INDETERMINATE"}
    needed = {"DEFAULT_DENY", "POLICY_BLOCK", "SELF_MODIFY", "MALFORMED", "UNKNOWN_TOOL", "OVERSIZE",
              "UNWITNESSED", "TRUST_VIOLATION", "RATE_LIMITED", "SECRET_EXFIL"}
    assert needed <= {r.value for r in Reason}
    order = [VerdictKind.ALLOW, VerdictKind.INDETERMINATE, VerdictKind.TRANSFORM, VerdictKind.QUARANTINE,
             VerdictKind.REQUIRE_WITNESS, VerdictKind.DENY]
    assert [RANK[k] for k in order] == sorted(RANK[k] for k in order) and len(set(RANK.values())) == 6
    assert VerdictKind.DEFER not in RANK


DISPOSITIONS = [
    (Reason.MALFORMED, Disposition.RETRYABLE),
    (Reason.RATE_LIMITED, Disposition.WAIT),
    (Reason.SELF_MODIFY, Disposition.ESCALATE),
    (Reason.TRUST_VIOLATION, Disposition.ESCALATE),
    (Reason.DEFAULT_DENY, Disposition.TERMINAL),
    (Reason.POLICY_BLOCK, Disposition.TERMINAL),
    (Reason.UNKNOWN_TOOL, Disposition.TERMINAL),
    (Reason.OVERSIZE, Disposition.TERMINAL),
    (Reason.UNWITNESSED, Disposition.TERMINAL),
    (Reason.SECRET_EXFIL, Disposition.TERMINAL),
]


@pytest.mark.parametrize("reason,disp", DISPOSITIONS)
def test_dispositions(reason: Reason, disp: Disposition) -> None:
    assert disposition_for(VerdictKind.DENY, reason) is disp
    assert Verdict.deny(reason, "x").disposition is disp


def test_allow_has_no_disposition() -> None:
    v = Verdict.allow("p")
    assert v.disposition is Disposition.NONE and v.allowed and not Verdict.deny(Reason.POLICY_BLOCK, "p").allowed
    assert Verdict.of(VerdictKind.QUARANTINE, Reason.PROMPT_INJECTION, "p").allowed  # runs, result withheld
    assert not Verdict.of(VerdictKind.REQUIRE_WITNESS, Reason.UNWITNESSED, "p").allowed
    assert v.to_dict() == {"kind": "ALLOW", "reason": "NONE", "by": "p", "disposition": "NONE", "detail": ""}


def test_toolcall_from_args_and_caches() -> None:
    c = ToolCall.from_args("shell", {"command": ["bash", "-lc", "ls"], "n": 3, "ok": True, "x": None, "d": {"k": "v"}},
                           caps={"fs"}, trace_id="t", meta={"cwd": "/p"})
    assert json.loads(c.args) == {"command": ["bash", "-lc", "ls"], "n": 3, "ok": True, "x": None, "d": {"k": "v"}}
    assert c.op == "tool" and c.seq_no == -1 and c.caps == frozenset({"fs"}) and c.meta == {"cwd": "/p"}
    assert c.args_text == "bash\n-lc\nls\n3\nv"
    raw = ToolCall("tool", "t", args=b'{"a": "b"}')
    assert raw.args_obj == {"a": "b"} and raw.args_obj is raw.args_obj  # parsed once
    with pytest.raises(ValueError):
        _ = ToolCall("tool", "t", args=b"{oops").args_obj
    t = c.with_args(b'{"command": "pwd"}')
    assert t.args_obj == {"command": "pwd"} and t.args_text == "pwd" and t.meta == c.meta
    assert c == ToolCall.from_args("shell", json.loads(c.args), caps={"fs"}, trace_id="t", meta={"cwd": "/p"})


def test_result_helpers() -> None:
    assert Result({"text": "hi"}).text == "hi" and Result({"text": "hi"}).ok
    assert Result(b"\xffab").text == "\ufffdab"
    assert json.loads(Result({"n": 1}).text) == {"n": 1}
    e = Result.error("boom", engine="x")
    assert e.status is Status.ERROR and e.payload == {"error": "boom"} and e.meta == {"engine": "x"}
    assert {s.value for s in Status} == {"OK", "ERROR", "PENDING"}


def test_protocols_are_structural() -> None:
    from fak.engines.mock import MockEngine

    m = MockEngine()
    assert isinstance(m, EngineDriver) and isinstance(m, LifecycleEngine)
    assert isinstance(m.admit(ToolCall.from_args("t", {})), EngineRequest)
    assert not isinstance(object(), EngineDriver)
