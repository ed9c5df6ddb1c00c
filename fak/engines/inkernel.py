"""`inkernel` engine: a tool call completes on a model living in this process.

The model is built on first use (importing this module costs nothing heavy) or at boot via
`preload()`. Which model: `gguf` (path or alias) if given, else $FAK_MODEL / $FAK_MODEL_DIR, else
the deterministic synthetic checkpoint (so a trace runs with no model file; set FAK_MODEL=gemma3-270m
for the real one). The call's arguments become a bounded prompt (at most `prompt_tokens` ids,
bytes when no tokenizer is installed), decoded greedily for up to `max_tokens` tokens.

Requests go through the continuous-batching scheduler (engine.scheduler.NativeScheduler): `admit` is
the LifecycleEngine seam (stream text pieces, cancel), `complete` drains an admitted request.
Scheduler options (constructor argument, else environment variable, else default):
  max_running  FAK_MAX_RUNNING  0 (unbounded)      kv_blocks  FAK_KV_BLOCKS  unset (growable pool)
  block_tokens FAK_BLOCK_TOKENS 16                 preempt    FAK_PREEMPT    swap | recompute
  victim       FAK_VICTIM       most-recent | cost-aware
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

from fak.abi import Result, Status, ToolCall, prompt_text
from fak.errors import FakError

_SCHED_ENV = {"max_running": ("FAK_MAX_RUNNING", int, 0), "kv_blocks": ("FAK_KV_BLOCKS", int, None),
              "block_tokens": ("FAK_BLOCK_TOKENS", int, 16), "preempt": ("FAK_PREEMPT", str, "swap"),
              "victim": ("FAK_VICTIM", str, "most-recent")}


def _sched_options(given: dict[str, Any]) -> dict[str, Any]:
    """Scheduler options: explicit value, else the environment variable, else the default."""
    out: dict[str, Any] = {}
    for key, (env, kind, default) in _SCHED_ENV.items():
        val = given.get(key)
        if val is None and os.environ.get(env, "").strip():
            try:
                val = kind(os.environ[env].strip())
            except ValueError:
                raise FakError(f"inkernel: {env}={os.environ[env]!r} is not a valid {kind.__name__}") from None
        out[key] = default if val is None else val
    _check_sched_options(out)
    return out


def _check_sched_options(opts: dict[str, Any]) -> None:
    """A bad scheduler option is a boot error (one line, exit 2), not an error result on every call."""
    from engine.preemption import PREEMPT_MODES, VICTIM_RULES

    choices = {"preempt": PREEMPT_MODES, "victim": VICTIM_RULES}
    for key, (env, _kind, _default) in _SCHED_ENV.items():
        val = opts[key]
        if key in choices:
            if val not in choices[key]:
                raise FakError(f"inkernel: {key} {val!r} (or ${env}): expected one of {', '.join(choices[key])}")
        elif val is not None and val < (0 if key == "max_running" else 1):
            raise FakError(f"inkernel: {key} {val} (or ${env}): expected a "
                           f"{'non-negative' if key == 'max_running' else 'positive'} integer")


def _prompt(call: ToolCall) -> str:
    text = prompt_text(call)
    return text if text is not None else f"{call.tool} {call.args.decode('utf-8', 'replace')}"


class InKernelEngine:
    engine_id = "inkernel"

    def __init__(self, gguf: str | None = None, resident: bool = False, prompt_tokens: int = 64,
                 max_tokens: int = 16, max_running: int | None = None, kv_blocks: int | None = None,
                 block_tokens: int | None = None, preempt: str | None = None, victim: str | None = None,
                 **_ignored: Any) -> None:
        if prompt_tokens <= 0 or max_tokens < 0:
            raise FakError(f"inkernel: prompt_tokens must be > 0 and max_tokens >= 0 (got {prompt_tokens}, {max_tokens})")
        self.gguf = gguf or os.environ.get("FAK_MODEL") or os.environ.get("FAK_MODEL_DIR") or "synthetic"
        self.resident, self.prompt_tokens, self.max_tokens = resident, prompt_tokens, max_tokens
        self._model: Any = None
        self._codec: Any = None
        self._lock = threading.Lock()
        self.sched_options = _sched_options({"max_running": max_running, "kv_blocks": kv_blocks,
                                             "block_tokens": block_tokens, "preempt": preempt, "victim": victim})
        self._sched: Any = None

    @property
    def model_name(self) -> str:
        return self.gguf

    def preload(self) -> None:
        """Build the model and the scheduler (its KV pool) now (boot); raises FakError with one line if it cannot."""
        from engine.errors import EngineError

        try:
            self.scheduler()
        except EngineError as exc:
            raise FakError(f"inkernel: {exc}") from None

    def _ensure(self) -> tuple[Any, Any]:
        if self._model is None:
            from engine import load_model
            from engine.aliases import resolve_model
            from engine.generate import codec_for
            from engine.session import warmup

            if self.gguf == "synthetic":
                model, path = load_model("synthetic"), None
            else:
                path = resolve_model(self.gguf)
                model = load_model(str(path), resident=self.resident)
            codec = codec_for(model, path, bytes_fallback=True)  # a weights-only GGUF: prompt bytes as ids
            warmup()  # numba kernels loaded here (boot / first use), not inside a request's timing
            self._codec = codec
            self._model = model
        return self._model, self._codec

    def caps(self) -> dict[str, Any]:
        return {"engine": "inkernel", "streaming": True, "deterministic": True, "model": self.model_name,
                "loaded": self._model is not None, "max_tokens": self.max_tokens, "prompt_tokens": self.prompt_tokens,
                "scheduler": dict(self.sched_options)}

    def prompt_ids(self, call: ToolCall) -> list[int]:
        model, codec = self._ensure()
        ids = [int(i) % model.config.vocab_size for i in codec.encode(_prompt(call))]
        return ids[: self.prompt_tokens] or [0]

    def scheduler(self) -> Any:
        """The engine's NativeScheduler (built with the model on first use)."""
        with self._lock:
            model, codec = self._ensure()
            if self._sched is None:
                from engine.scheduler import NativeScheduler

                # Text streaming needs a codec that can spell every model id (not bytes over a big vocabulary).
                text_ok = codec.vocab_size >= model.config.vocab_size
                self._sched = NativeScheduler(model, tokenizer=codec if text_ok else None, **self.sched_options)
            return self._sched

    def admit(self, call: ToolCall) -> _InKernelRequest:
        """Queue the call on the scheduler; iterate the request for text pieces, then take result()."""
        from engine.errors import EngineError
        from engine.lane import Request

        try:
            sched = self.scheduler()
            ids = self.prompt_ids(call)
            if self.max_tokens == 0:
                return _InKernelRequest(self, call, ids, None)
            handle = sched.admit(Request(ids, max_new_tokens=self.max_tokens, request_id=call.trace_id or ""))
        except EngineError as exc:
            return _InKernelRequest(self, call, [], None, error=f"inkernel: {exc}")
        return _InKernelRequest(self, call, ids, handle)

    def complete(self, call: ToolCall) -> Result:
        return self.admit(call).result()

    def close(self) -> None:
        """Stop the scheduler (aborts requests in flight)."""
        if self._sched is not None:
            self._sched.close()


class _InKernelRequest:
    """An EngineRequest over a scheduler handle: text pieces as they decode, then the engine's Result."""

    def __init__(self, engine: InKernelEngine, call: ToolCall, ids: list[int], handle: Any,
                 error: str | None = None) -> None:
        self._engine, self._call, self._ids, self._handle, self._error = engine, call, ids, handle, error

    def tokens(self) -> Iterator[str]:
        if self._handle is not None:
            yield from self._handle.pieces()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()

    def result(self) -> Result:
        if self._error is not None:
            return Result.error(self._error, engine="inkernel")
        out: list[int] = []
        reason = "length"
        if self._handle is not None:
            r = self._handle.result()
            out, reason = list(r.token_ids), r.finish_reason.value
            if r.error is not None and reason == "error":
                return Result.error(f"inkernel: {r.error}", engine="inkernel")
        e = self._engine
        payload: dict[str, Any] = {"tool": self._call.tool, "engine": "inkernel", "model": e.model_name,
                                   "generated_tokens": out}
        try:
            payload["generated_text"] = e._codec.decode(out, skip_special=True)
        except Exception:  # a text view is optional; ids are the result
            pass
        meta = {"engine": "inkernel", "model": e.model_name, "input_tokens": len(self._ids),
                "output_tokens": len(out), "finish_reason": reason}
        if reason == "cancelled":
            meta["cancelled"] = True
        return Result(payload, Status.OK, meta)
