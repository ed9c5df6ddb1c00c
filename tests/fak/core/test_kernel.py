"""Kernel: fold rules, witness path, reap/dispatch, result admission (quarantine), counters."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fak.core.abi import Reason, Result, Status, ToolCall, Verdict, VerdictKind
from fak.core.kernel import Kernel, MetaWitness
from fak.engines.mock import MockEngine

K = VerdictKind
A, D, T, Q, W, F, I = K.ALLOW, K.DENY, K.TRANSFORM, K.QUARANTINE, K.REQUIRE_WITNESS, K.DEFER, K.INDETERMINATE


def adj(kind: VerdictKind, name: str, log: list[str] | None = None, reason: Reason = Reason.POLICY_BLOCK):  # type: ignore[no-untyped-def]
    def f(call: ToolCall) -> Verdict:
        if log is not None:
            log.append(name)
        if kind is K.TRANSFORM:
            return Verdict.of(kind, Reason.REDACTED, name, new_args=b'{"redacted":true}')
        return Verdict.of(kind, Reason.NONE if kind in (A, F, I) else reason, name)

    f.name = name  # type: ignore[attr-defined]
    return f


def call(**meta: Any) -> ToolCall:
    return ToolCall.from_args("tool", {"x": 1}, meta=meta)


# chain of kinds -> (final kind, final reason, by)
FOLD_TABLE = [
    ([], D, Reason.DEFAULT_DENY, "kernel"),
    ([F], D, Reason.DEFAULT_DENY, "kernel"),
    ([F, F], D, Reason.DEFAULT_DENY, "kernel"),
    ([I], D, Reason.DEFAULT_DENY, "kernel"),
    ([I, F], D, Reason.DEFAULT_DENY, "kernel"),
    ([A, I], D, Reason.DEFAULT_DENY, "kernel"),
    ([A], A, Reason.NONE, "a0"),
    ([F, A], A, Reason.NONE, "a1"),
    ([A, A], A, Reason.NONE, "a0"),  # ties keep the earlier adjudicator
    ([A, T], T, Reason.REDACTED, "a1"),
    ([I, T], T, Reason.REDACTED, "a1"),
    ([T, A, F], T, Reason.REDACTED, "a0"),
    ([T, Q], Q, Reason.POLICY_BLOCK, "a1"),
    ([Q, T, A], Q, Reason.POLICY_BLOCK, "a0"),
    ([A, W], D, Reason.UNWITNESSED, "a1"),  # no witness resolver -> UNWITNESSED
    ([W, Q, T], D, Reason.UNWITNESSED, "a0"),
    ([A, D], D, Reason.POLICY_BLOCK, "a1"),
    ([D, A], D, Reason.POLICY_BLOCK, "a0"),
    ([W, D, T], D, Reason.POLICY_BLOCK, "a1"),
    ([F, I, D], D, Reason.POLICY_BLOCK, "a2"),
]


@pytest.mark.parametrize("kinds,kind,reason,by", FOLD_TABLE)
def test_fold(kinds: list[VerdictKind], kind: VerdictKind, reason: Reason, by: str) -> None:
    k = Kernel([adj(x, f"a{i}") for i, x in enumerate(kinds)])
    d = k.submit(call())
    assert (d.verdict.kind, d.verdict.reason, d.verdict.by) == (kind, reason, by)


def test_evaluation_stops_at_deny() -> None:
    log: list[str] = []
    Kernel([adj(A, "a", log), adj(D, "d", log), adj(A, "after", log)]).submit(call())
    assert log == ["a", "d"]


def test_crashing_adjudicator_fails_closed() -> None:
    def boom(c: ToolCall) -> Verdict:
        raise RuntimeError("bug")

    d = Kernel([adj(A, "a"), boom]).submit(call())
    assert (d.verdict.kind, d.verdict.reason) == (D, Reason.DEFAULT_DENY) and "boom" in d.verdict.detail
    d = Kernel([boom, adj(T, "t")]).submit(call())
    assert d.verdict.kind is T  # a conclusive, more restrictive verdict still wins over INDETERMINATE


@pytest.mark.parametrize("args", [b"not json", b"[1,2]", b'"s"'])
def test_malformed_args(args: bytes) -> None:
    d = Kernel([adj(A, "a")]).submit(ToolCall("tool", "t", args=args))
    assert (d.verdict.kind, d.verdict.reason) == (D, Reason.MALFORMED)
    assert d.verdict.disposition.value == "RETRYABLE"


def test_submit_assigns_sequence_and_transforms_args() -> None:
    k = Kernel([adj(T, "t")])
    d1, d2 = k.submit(call()), k.submit(call())
    assert (d1.call.seq_no, d2.call.seq_no) == (1, 2)
    assert d1.call.args_obj == {"redacted": True}
    assert k.reap(d1).payload["text"] == 'tool {"redacted":true}'  # type: ignore[index]


# witness answers -> final verdict
def _w(ans: bool | None, name: str):  # type: ignore[no-untyped-def]
    def f(c: ToolCall, v: Verdict) -> bool | None:
        return ans

    f.name = name  # type: ignore[attr-defined]
    return f


WITNESS_TABLE = [
    ([], D, Reason.UNWITNESSED, "need"),
    ([None], D, Reason.UNWITNESSED, "need"),
    ([True], A, Reason.WITNESSED, "w0"),
    ([None, True], A, Reason.WITNESSED, "w1"),
    ([False], D, Reason.TRUST_VIOLATION, "w0"),
    ([True, False], D, Reason.TRUST_VIOLATION, "w1"),  # any refutation wins
]


@pytest.mark.parametrize("answers,kind,reason,by", WITNESS_TABLE)
def test_witness(answers: list[bool | None], kind: VerdictKind, reason: Reason, by: str) -> None:
    k = Kernel([adj(W, "need")], witnesses=[_w(a, f"w{i}") for i, a in enumerate(answers)])
    v = k.submit(call()).verdict
    assert (v.kind, v.reason, v.by) == (kind, reason, by)
    if reason is Reason.TRUST_VIOLATION:
        assert v.disposition.value == "ESCALATE"


def test_outranked_transform_and_quarantine_are_kept() -> None:
    mock = MockEngine()
    # TRANSFORM outranked by QUARANTINE: args still rewritten, result withheld
    k = Kernel([adj(T, "t"), adj(Q, "q")], engines={"mock": mock})
    d = k.submit(call())
    assert d.verdict.kind is Q and d.call.args_obj == {"redacted": True}
    r = k.reap(d)
    assert r.meta["quarantined"] and k.stats()["transforms"] == 1 and k.stats()["quarantines"] == 1
    # witnessed REQUIRE_WITNESS over TRANSFORM: ALLOW with the rewritten args
    k = Kernel([adj(T, "t"), adj(W, "w")], witnesses=[MetaWitness()])
    d = k.submit(call(witness="confirmed"))
    assert (d.verdict.kind, d.verdict.reason) == (A, Reason.WITNESSED) and d.call.args_obj == {"redacted": True}
    # witnessed REQUIRE_WITNESS over QUARANTINE: the result stays withheld
    k = Kernel([adj(Q, "q"), adj(W, "w")], witnesses=[MetaWitness()])
    assert k.submit(call(witness="confirmed")).verdict.kind is Q
    assert k.submit(call(witness="refuted")).verdict.reason is Reason.TRUST_VIOLATION


def test_meta_witness() -> None:
    k = Kernel([adj(W, "need")], witnesses=[MetaWitness()])
    assert k.syscall(call(witness="confirmed")).ok
    assert k.submit(call(witness="refuted")).verdict.reason is Reason.TRUST_VIOLATION
    assert k.submit(call()).verdict.reason is Reason.UNWITNESSED


# -- reap and result admission ------------------------------------------------------------------
def _admitter(kind: VerdictKind):  # type: ignore[no-untyped-def]
    def f(c: ToolCall, r: Result) -> Verdict:
        if kind is Q and "INJECT" not in r.text:
            return Verdict.allow("adm")
        return Verdict.of(kind, Reason.PROMPT_INJECTION if kind is Q else Reason.SECRET_EXFIL, "adm", "hit")

    return f


RESULT_TABLE = [
    # (submit kind, admitter kind, reply, status, quarantined, counters delta)
    (A, A, "fine", Status.OK, False, {"engine_calls": 1}),
    (A, Q, "fine", Status.OK, False, {"engine_calls": 1}),
    (A, Q, "please INJECT", Status.OK, True, {"engine_calls": 1, "quarantines": 1}),
    (Q, A, "fine", Status.OK, True, {"engine_calls": 1, "quarantines": 1}),
    (A, D, "x", Status.ERROR, False, {"engine_calls": 1, "result_denies": 1}),
    (T, A, "x", Status.OK, False, {"engine_calls": 1, "transforms": 1}),
    (D, A, "x", Status.ERROR, False, {"denies": 1}),
]


@pytest.mark.parametrize("sk,ak,reply,status,quarantined,delta", RESULT_TABLE)
def test_reap(sk: VerdictKind, ak: VerdictKind, reply: str, status: Status, quarantined: bool, delta: dict[str, int]) -> None:
    k = Kernel([adj(sk, "s")], admitters=[_admitter(ak)], engines={"mock": MockEngine()})
    r = k.syscall(call(mock_reply=reply))
    assert r.status is status
    assert bool(r.meta.get("quarantined")) is quarantined
    if quarantined:
        assert r.payload["quarantined"] is True and reply not in json.dumps(r.payload)  # type: ignore[index]
        assert r.payload["withheld_bytes"] == len(reply)  # type: ignore[index]
    want = {"submits": 1, "engine_calls": 0, "denies": 0, "transforms": 0, "quarantines": 0, "result_denies": 0, **delta}
    assert k.stats() == want


def test_denied_result_carries_verdict() -> None:
    mock = MockEngine()
    r = Kernel([adj(D, "pol", reason=Reason.SELF_MODIFY)], engines={"mock": mock}).syscall(call())
    assert r.status is Status.ERROR and mock.calls == 0
    assert r.payload["verdict"] == {"kind": "DENY", "reason": "SELF_MODIFY", "by": "pol", "disposition": "ESCALATE", "detail": ""}  # type: ignore[index]
    assert r.meta["verdict"].reason is Reason.SELF_MODIFY


def test_engine_selection_and_failures() -> None:
    a, b = MockEngine(reply="from a"), MockEngine(reply="from b")
    k = Kernel([adj(A, "a")], engines={"a": a, "b": b}, default_engine="a")
    assert k.syscall(call()).text == "from a"
    assert k.syscall(ToolCall.from_args("t", {}, engine="b")).text == "from b"
    r = k.syscall(ToolCall.from_args("t", {}, engine="nope"))
    assert r.status is Status.ERROR and "unknown engine 'nope'" in r.payload["error"]  # type: ignore[index]

    class Crashy:
        def complete(self, c: ToolCall) -> Result:
            raise OSError("disk on fire")

        def caps(self) -> dict[str, Any]:
            return {}

    r = Kernel([adj(A, "a")], engines={"mock": Crashy()}).syscall(call())  # type: ignore[dict-item]
    assert r.status is Status.ERROR and "disk on fire" in r.payload["error"]  # type: ignore[index]
