"""The kernel ABI: what crosses the kernel (ToolCall), what comes back (Result), how it was judged (Verdict),
and the two engine protocols (one-shot EngineDriver, streaming LifecycleEngine).

Conventions (stable; other modules build on them):
- `ToolCall.args` is the call's arguments as UTF-8 JSON bytes (an object). The parsed dict and a flat
  text view are cached on the call (`args_obj`, `args_text`) so adjudicators never re-parse them.
- `Result.payload` is a JSON-serializable dict (engines return e.g. `{"text": ..., "usage": {...}}`)
  or raw `bytes` for binary output. An error Result has `status=ERROR` and a payload with "error".
- `EngineRequest.tokens()` yields text pieces (`str`), in order; their concatenation is the output
  text. Engines that only know token ids decode before yielding.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


class VerdictKind(enum.Enum):
    ALLOW = "ALLOW"
    DENY = "DENY"
    TRANSFORM = "TRANSFORM"
    QUARANTINE = "QUARANTINE"
    REQUIRE_WITNESS = "REQUIRE_WITNESS"
    DEFER = "DEFER"
    INDETERMINATE = "INDETERMINATE"


# Fold order: the most restrictive conclusive verdict wins. DEFER has no rank (it is skipped).
RANK: dict[VerdictKind, int] = {
    VerdictKind.ALLOW: 0,
    VerdictKind.INDETERMINATE: 1,
    VerdictKind.TRANSFORM: 2,
    VerdictKind.QUARANTINE: 3,
    VerdictKind.REQUIRE_WITNESS: 4,
    VerdictKind.DENY: 5,
}


class Reason(enum.Enum):
    NONE = "NONE"  # an ALLOW needs no reason
    DEFAULT_DENY = "DEFAULT_DENY"
    POLICY_BLOCK = "POLICY_BLOCK"
    SELF_MODIFY = "SELF_MODIFY"
    MALFORMED = "MALFORMED"
    UNKNOWN_TOOL = "UNKNOWN_TOOL"
    OVERSIZE = "OVERSIZE"
    UNWITNESSED = "UNWITNESSED"
    TRUST_VIOLATION = "TRUST_VIOLATION"
    RATE_LIMITED = "RATE_LIMITED"
    SECRET_EXFIL = "SECRET_EXFIL"
    WITNESSED = "WITNESSED"  # ALLOW after a witness confirmed
    REDACTED = "REDACTED"  # TRANSFORM that rewrote arguments
    PROMPT_INJECTION = "PROMPT_INJECTION"  # QUARANTINE of a result


class Disposition(enum.Enum):
    """What the agent should do about a non-ALLOW verdict."""

    NONE = "NONE"  # allowed: nothing to do
    RETRYABLE = "RETRYABLE"  # fix the call and try again
    WAIT = "WAIT"  # try the same call later
    ESCALATE = "ESCALATE"  # a human must look
    TERMINAL = "TERMINAL"  # do not retry


_DISPOSITION: dict[Reason, Disposition] = {
    Reason.MALFORMED: Disposition.RETRYABLE,
    Reason.RATE_LIMITED: Disposition.WAIT,
    Reason.SELF_MODIFY: Disposition.ESCALATE,
    Reason.TRUST_VIOLATION: Disposition.ESCALATE,
}


def disposition_for(kind: VerdictKind, reason: Reason) -> Disposition:
    if kind is VerdictKind.ALLOW or kind is VerdictKind.TRANSFORM:
        return Disposition.NONE
    return _DISPOSITION.get(reason, Disposition.TERMINAL)


@dataclass(slots=True)
class Verdict:
    kind: VerdictKind
    reason: Reason = Reason.NONE
    by: str = ""
    disposition: Disposition = Disposition.NONE
    detail: str = ""
    new_args: bytes | None = None  # TRANSFORM: the rewritten arguments (JSON bytes)

    @staticmethod
    def allow(by: str, detail: str = "") -> Verdict:
        return Verdict(VerdictKind.ALLOW, Reason.NONE, by, Disposition.NONE, detail)

    @staticmethod
    def deny(reason: Reason, by: str, detail: str = "") -> Verdict:
        return Verdict(VerdictKind.DENY, reason, by, disposition_for(VerdictKind.DENY, reason), detail)

    @staticmethod
    def of(kind: VerdictKind, reason: Reason, by: str, detail: str = "", new_args: bytes | None = None) -> Verdict:
        return Verdict(kind, reason, by, disposition_for(kind, reason), detail, new_args)

    @property
    def allowed(self) -> bool:
        """True if the call may reach an engine (ALLOW, TRANSFORM, QUARANTINE-the-result)."""
        return self.kind in _RUNNABLE

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "reason": self.reason.value,
            "by": self.by,
            "disposition": self.disposition.value,
            "detail": self.detail,
        }


_RUNNABLE = frozenset({VerdictKind.ALLOW, VerdictKind.TRANSFORM, VerdictKind.QUARANTINE})

_UNSET: Any = object()


@dataclass(slots=True)
class ToolCall:
    op: str  # "tool" for a tool call; "complete" for a plain model turn
    tool: str
    engine: str | None = None  # engine id; None = the kernel's default engine
    args: bytes = b"{}"
    caps: frozenset[str] = frozenset()
    trace_id: str = ""
    seq_no: int = -1  # assigned by Kernel.submit
    meta: dict[str, Any] = field(default_factory=dict)
    # Caches (not part of identity): parsed args and their flat text, filled on first use.
    _obj: Any = field(default=_UNSET, repr=False, compare=False)
    _text: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_args(
        cls,
        tool: str,
        args: Mapping[str, Any] | None = None,
        *,
        op: str = "tool",
        engine: str | None = None,
        caps: frozenset[str] | set[str] | tuple[str, ...] = frozenset(),
        trace_id: str = "",
        meta: dict[str, Any] | None = None,
    ) -> ToolCall:
        """Build a call from a dict of arguments (serialized once, parse cache pre-filled)."""
        obj = dict(args or {})
        raw = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
        call = cls(op, tool, engine, raw, frozenset(caps), trace_id, -1, dict(meta or {}))
        call._obj = obj
        return call

    @property
    def args_obj(self) -> Any:
        """The parsed arguments (cached). Raises ValueError if args are not valid JSON."""
        if self._obj is _UNSET:
            self._obj = json.loads(self.args)
        return self._obj

    @property
    def args_text(self) -> str:
        """Every string leaf of the arguments joined by newlines (cached): what arg regexes scan."""
        if self._text is None:
            parts: list[str] = []
            _leaves(self.args_obj, parts)
            self._text = "\n".join(parts)
        return self._text

    def with_args(self, new_args: bytes) -> ToolCall:
        """A copy carrying rewritten arguments (TRANSFORM); caches reset."""
        return ToolCall(self.op, self.tool, self.engine, new_args, self.caps, self.trace_id, self.seq_no, self.meta)


def _leaves(obj: Any, out: list[str]) -> None:
    if isinstance(obj, str):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _leaves(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _leaves(v, out)
    elif obj is not None and not isinstance(obj, bool):
        out.append(str(obj))


def prompt_text(call: ToolCall) -> str | None:
    """The text a model-backed engine answers: args "prompt", else the last message's content, else None."""
    try:
        obj = call.args_obj
    except ValueError:
        return None
    if isinstance(obj, dict):
        if isinstance(obj.get("prompt"), str):
            return obj["prompt"]
        msgs = obj.get("messages")
        if isinstance(msgs, list) and msgs and isinstance(msgs[-1], dict):
            return str(msgs[-1].get("content", ""))
    return None


class Status(enum.Enum):
    OK = "OK"
    ERROR = "ERROR"
    PENDING = "PENDING"


@dataclass(slots=True)
class Result:
    payload: dict[str, Any] | bytes
    status: Status = Status.OK
    meta: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def error(message: str, **meta: Any) -> Result:
        return Result({"error": message}, Status.ERROR, dict(meta))

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def text(self) -> str:
        """The payload's text: payload["text"], else the JSON of the payload, else decoded bytes."""
        p = self.payload
        if isinstance(p, bytes):
            return p.decode("utf-8", "replace")
        t = p.get("text")
        if isinstance(t, str):
            return t
        return json.dumps(p, ensure_ascii=False, default=str)


@runtime_checkable
class EngineDriver(Protocol):
    """A one-shot engine: a call in, a Result out. Never raises for upstream trouble: error Result."""

    def complete(self, call: ToolCall) -> Result: ...

    def caps(self) -> dict[str, Any]: ...


@runtime_checkable
class EngineRequest(Protocol):
    """One admitted request: stream its text pieces, then take the final Result, or cancel it."""

    def tokens(self) -> Iterator[str]: ...

    def result(self) -> Result: ...

    def cancel(self) -> None: ...


@runtime_checkable
class LifecycleEngine(Protocol):
    """A streaming engine: `admit` returns at once; the request runs while the caller iterates."""

    def admit(self, call: ToolCall) -> EngineRequest: ...

    def complete(self, call: ToolCall) -> Result: ...

    def caps(self) -> dict[str, Any]: ...


class OneShotRequest:
    """An EngineRequest over a one-shot driver: runs `complete` on first use, yields its text as one piece."""

    def __init__(self, driver: EngineDriver, call: ToolCall) -> None:
        self._driver, self._call = driver, call
        self._result: Result | None = None
        self._cancelled = False

    def _run(self) -> Result:
        if self._result is None:
            if self._cancelled:
                self._result = Result.error("cancelled", cancelled=True)
            else:
                try:
                    self._result = self._driver.complete(self._call)
                except Exception as exc:  # a driver must not crash the kernel
                    self._result = Result.error(f"engine failed: {type(exc).__name__}: {exc}")
        return self._result

    def tokens(self) -> Iterator[str]:
        res = self._run()
        if res.ok:
            yield res.text

    def result(self) -> Result:
        return self._run()

    def cancel(self) -> None:
        self._cancelled = True  # before the run: the result is "cancelled"; after: streaming stops


class OneShotLifecycle:
    """Wraps an EngineDriver so it also offers `admit` (see `as_lifecycle`)."""

    def __init__(self, driver: EngineDriver) -> None:
        self.driver = driver

    def admit(self, call: ToolCall) -> EngineRequest:
        return OneShotRequest(self.driver, call)

    def complete(self, call: ToolCall) -> Result:
        return self.driver.complete(call)

    def caps(self) -> dict[str, Any]:
        return self.driver.caps()


def as_lifecycle(driver: EngineDriver) -> LifecycleEngine:
    """The driver itself if it already has `admit`, else a one-shot wrapper."""
    if callable(getattr(driver, "admit", None)):
        return driver  # type: ignore[return-value]
    return OneShotLifecycle(driver)
