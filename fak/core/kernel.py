"""The kernel: every tool call is submitted (sequence number + adjudication), then reaped (dispatched to
an engine if allowed, its result admitted). `syscall` = submit + reap.

Fold rules of `submit` (fail closed):
- malformed arguments (not a JSON object) -> DENY MALFORMED, before any adjudicator;
- empty chain -> DENY DEFAULT_DENY; DEFER is skipped; all-DEFER -> DENY DEFAULT_DENY;
- otherwise the most restrictive verdict wins, ALLOW < INDETERMINATE < TRANSFORM < QUARANTINE <
  REQUIRE_WITNESS < DENY, ties keep the earlier adjudicator; evaluation stops at the first DENY;
- a winning INDETERMINATE (nothing conclusive was more restrictive) -> DENY DEFAULT_DENY;
- an adjudicator that raises counts as INDETERMINATE;
- a winning REQUIRE_WITNESS asks the witness resolvers: any refutes -> DENY TRUST_VIOLATION, else any
  confirms -> ALLOW (reason WITNESSED), else DENY UNWITNESSED.
A winning TRANSFORM replaces the call's arguments with `new_args`; a winning QUARANTINE runs the call
but withholds its result. A TRANSFORM or QUARANTINE outranked by a verdict that still lets the call
run (QUARANTINE, a witnessed REQUIRE_WITNESS) is not lost: the first TRANSFORM's arguments are used
and a QUARANTINE keeps withholding the result. After the engine, result admitters run: the most restrictive of their
verdicts applies (QUARANTINE: payload withheld and the result marked; DENY: an error Result).
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from fak.core.abi import RANK, EngineDriver, Reason, Result, Status, ToolCall, Verdict, VerdictKind
from fak.errors import FakError

Adjudicator = Callable[[ToolCall], Verdict]
# A witness answers True (confirmed), False (refuted) or None (no opinion).
WitnessResolver = Callable[[ToolCall, Verdict], "bool | None"]
ResultAdmitter = Callable[[ToolCall, Result], Verdict]

_DEFER = VerdictKind.DEFER
_DENY = VerdictKind.DENY
_INDET = VerdictKind.INDETERMINATE
_WITNESS = VerdictKind.REQUIRE_WITNESS
_TRANSFORM = VerdictKind.TRANSFORM
_QUARANTINE = VerdictKind.QUARANTINE


def _name(fn: Any) -> str:
    return str(getattr(fn, "name", None) or getattr(fn, "__name__", None) or type(fn).__name__)


@dataclass
class Counters:
    submits: int = 0
    engine_calls: int = 0
    denies: int = 0
    transforms: int = 0
    quarantines: int = 0
    result_denies: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(slots=True)
class Decision:
    """What `submit` returns: the call as it will run (arguments rewritten by a TRANSFORM) and its verdict."""

    call: ToolCall
    verdict: Verdict


class MetaWitness:
    """Witness from `call.meta["witness"]` ("confirmed" / "refuted"). For trace replay and tests only:
    in a live setting the agent must not be able to witness its own calls."""

    name = "witness:meta"

    def __call__(self, call: ToolCall, verdict: Verdict) -> bool | None:
        w = call.meta.get("witness")
        return True if w == "confirmed" else False if w == "refuted" else None


class Kernel:
    def __init__(
        self,
        adjudicators: Iterable[Adjudicator] = (),
        *,
        witnesses: Iterable[WitnessResolver] = (),
        admitters: Iterable[ResultAdmitter] = (),
        engines: dict[str, EngineDriver] | None = None,
        default_engine: str = "mock",
        engine_opts: dict[str, dict[str, Any]] | None = None,
        journal: Any = None,
    ) -> None:
        self.chain: list[Adjudicator] = list(adjudicators)
        self.witnesses: list[WitnessResolver] = list(witnesses)
        self.admitters: list[ResultAdmitter] = list(admitters)
        self.engines: dict[str, EngineDriver] = dict(engines or {})
        self.default_engine = default_engine
        self.engine_opts = dict(engine_opts or {})
        self.journal = journal  # fak.core.journal.Journal or None
        # Counter `+=` on a plain attribute does not release the GIL mid-update in CPython 3.11; the
        # sequence comes from itertools.count, which is atomic.
        self.counters = Counters()
        self._seq = itertools.count(1)
        self._engine_lock = threading.Lock()

    @classmethod
    def with_policy(cls, policy: Any, **kw: Any) -> Kernel:
        """A kernel whose chain is the policy and whose admitter is the policy's result check."""
        return cls([policy], admitters=[policy.admit_result], **kw)

    # -- submit ------------------------------------------------------------------------------
    def submit(self, call: ToolCall) -> Decision:
        call.seq_no = next(self._seq)
        self.counters.submits += 1
        v, xform = self._fold(call)
        if v.kind is _DENY:
            self.counters.denies += 1
        elif xform is not None and v.allowed:
            # A TRANSFORM outranked by QUARANTINE or a witnessed REQUIRE_WITNESS still rewrites the args.
            self.counters.transforms += 1
            if xform.new_args is not None:
                call = call.with_args(xform.new_args)
        if self.journal is not None:
            self.journal.record(call, v, phase="submit")
        return Decision(call, v)

    def adjudicate(self, call: ToolCall) -> Decision:
        """What submit would decide, as a dry run: no sequence number, no counters, no journal
        (policy testers). A TRANSFORM's rewritten arguments are in the returned call."""
        v, xform = self._fold(call)
        if v.kind is not _DENY and xform is not None and v.allowed and xform.new_args is not None:
            call = call.with_args(xform.new_args)
        return Decision(call, v)

    def _fold(self, call: ToolCall) -> tuple[Verdict, Verdict | None]:
        """(final verdict, the first TRANSFORM seen or None)."""
        try:
            if type(call.args_obj) is not dict:
                return Verdict.deny(Reason.MALFORMED, "kernel", "arguments must be a JSON object"), None
        except ValueError as exc:
            return Verdict.deny(Reason.MALFORMED, "kernel", f"arguments are not valid JSON: {exc}"), None
        best: Verdict | None = None
        best_rank = -1
        xform: Verdict | None = None
        quar: Verdict | None = None
        for adj in self.chain:
            try:
                v = adj(call)
            except Exception as exc:  # fail closed: a crashing adjudicator cannot allow anything
                v = Verdict.of(_INDET, Reason.DEFAULT_DENY, _name(adj), f"adjudicator failed: {type(exc).__name__}: {exc}")
            k = v.kind
            if k is _DEFER:
                continue
            if k is _DENY:
                return v, None
            if k is _TRANSFORM and xform is None:
                xform = v
            elif k is _QUARANTINE and quar is None:
                quar = v
            r = RANK[k]
            if r > best_rank:
                best, best_rank = v, r
        if best is None:
            detail = "no adjudicator" if not self.chain else "every adjudicator deferred"
            return Verdict.deny(Reason.DEFAULT_DENY, "kernel", detail), None
        if best.kind is _INDET:
            detail = f"indeterminate verdict from {best.by}" + (f": {best.detail}" if best.detail else "")
            return Verdict.deny(Reason.DEFAULT_DENY, "kernel", detail), None
        if best.kind is _WITNESS:
            w = self._witness(call, best)
            # A witness lifts the REQUIRE_WITNESS only: a folded QUARANTINE still withholds the result.
            return (quar if quar is not None and w.kind is VerdictKind.ALLOW else w), xform
        return best, xform

    def _witness(self, call: ToolCall, wanted: Verdict) -> Verdict:
        confirmed_by = ""
        for w in self.witnesses:
            try:
                ans = w(call, wanted)
            except Exception:
                ans = None  # a broken witness has no opinion; without a confirmation we deny
            if ans is False:
                return Verdict.deny(Reason.TRUST_VIOLATION, _name(w), f"witness refuted: {wanted.detail}")
            if ans is True and not confirmed_by:
                confirmed_by = _name(w)
        if confirmed_by:
            return Verdict.of(VerdictKind.ALLOW, Reason.WITNESSED, confirmed_by, f"witnessed: {wanted.detail}")
        return Verdict.deny(Reason.UNWITNESSED, wanted.by, wanted.detail or "no witness confirmed the call")

    # -- reap --------------------------------------------------------------------------------
    def engine_for(self, engine_id: str) -> EngineDriver:
        """The kernel's engine instance for an id, built once (under a lock: an engine may load a model)."""
        eng = self.engines.get(engine_id)
        if eng is None:
            from fak.core.registry import get_engine

            with self._engine_lock:
                eng = self.engines.get(engine_id)
                if eng is None:
                    eng = self.engines[engine_id] = get_engine(engine_id, **self.engine_opts.get(engine_id, {}))
        return eng

    def reap(self, decision: Decision) -> Result:
        call, v = decision.call, decision.verdict
        base = {"seq_no": call.seq_no, "verdict": v}
        if not v.allowed:
            payload = {"error": f"denied: {v.reason.value}: {v.detail}".rstrip(": "), "verdict": v.to_dict()}
            return Result(payload, Status.ERROR, base)
        engine_id = call.engine or self.default_engine
        try:
            engine = self.engine_for(engine_id)
        except FakError as exc:
            return Result.error(str(exc), **base)
        self.counters.engine_calls += 1
        try:
            res = engine.complete(call)
        except Exception as exc:  # an engine must return error Results; never let one crash the kernel
            res = Result.error(f"engine {engine_id!r} failed: {type(exc).__name__}: {exc}")
        res.meta.update(base)
        res.meta.setdefault("engine", engine_id)
        rv = self._admit(call, res)
        if v.kind is _QUARANTINE and RANK.get(rv.kind, 0) < RANK[_QUARANTINE]:
            rv = v
        if rv.kind is VerdictKind.ALLOW:
            return res
        if self.journal is not None:
            self.journal.record(call, rv, phase="result")
        res.meta["result_verdict"] = rv
        if rv.kind is _DENY:
            self.counters.result_denies += 1
            payload = {"error": f"result denied: {rv.reason.value}: {rv.detail}", "verdict": rv.to_dict()}
            return Result(payload, Status.ERROR, res.meta)
        self.counters.quarantines += 1
        return _quarantined(res, rv)

    def admit(self, call: ToolCall, res: Result) -> Verdict:
        """The result admitters on a result the kernel did not produce itself (an agent ran the call
        and sends its output back): counted, and journaled unless ALLOW, like a reaped result."""
        rv = self._admit(call, res)
        if rv.kind is VerdictKind.ALLOW:
            return rv
        if self.journal is not None:
            self.journal.record(call, rv, phase="result")
        if rv.kind is _DENY:
            self.counters.result_denies += 1
        else:
            self.counters.quarantines += 1
        return rv

    def _admit(self, call: ToolCall, res: Result) -> Verdict:
        best = Verdict.allow("kernel")
        for adm in self.admitters:
            try:
                v = adm(call, res)
            except Exception as exc:  # fail closed on the result side too
                v = Verdict.of(_QUARANTINE, Reason.DEFAULT_DENY, _name(adm), f"admitter failed: {exc}")
            if v.kind is _DENY:
                return v
            if v.kind in (_QUARANTINE, _INDET, _WITNESS):  # anything not clearly fine is withheld
                if best.kind is not _QUARANTINE:
                    best = v if v.kind is _QUARANTINE else Verdict.of(_QUARANTINE, v.reason, v.by, v.detail)
        return best

    def syscall(self, call: ToolCall) -> Result:
        return self.reap(self.submit(call))

    def stats(self) -> dict[str, int]:
        return self.counters.as_dict()


def _quarantined(res: Result, v: Verdict) -> Result:
    """The result marked and its payload withheld (only a digest and size remain, for audit)."""
    raw = res.payload if isinstance(res.payload, bytes) else res.text.encode()
    payload = {
        "quarantined": True,
        "reason": v.reason.value,
        "detail": v.detail,
        "withheld_bytes": len(raw),
        "withheld_sha256": hashlib.sha256(raw).hexdigest(),
    }
    meta = dict(res.meta, quarantined=True)
    return Result(payload, res.status, meta)
