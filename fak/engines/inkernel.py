"""`inkernel` engine: a tool call completes on a model living in this process.

The model is built on first use (importing this module costs nothing heavy) or at boot via
`preload()`. Which model: `gguf` (path or alias) if given, else $FAK_MODEL / $FAK_MODEL_DIR, else
the deterministic synthetic checkpoint (so a trace runs with no model file; set FAK_MODEL=gemma3-270m
for the real one). The call's arguments become a bounded prompt (at most `prompt_tokens` ids,
bytes when no tokenizer is installed), decoded greedily for up to `max_tokens` tokens.

The model, its tokenizer and the continuous-batching scheduler come from fak.runtime.boot, the one boot every
model-using subcommand shares: `admit` is the LifecycleEngine seam (stream text pieces, cancel),
`complete` drains an admitted request. Weights are resident unless `resident=False`.
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

from fak.core.abi import Result, Status, ToolCall, prompt_text
from fak.errors import FakError


def _prompt(call: ToolCall) -> str:
    text = prompt_text(call)
    return text if text is not None else f"{call.tool} {call.args.decode('utf-8', 'replace')}"


class InKernelEngine:
    engine_id = "inkernel"

    def __init__(self, gguf: str | None = None, resident: bool = True, prompt_tokens: int = 64,
                 max_tokens: int = 16, max_running: int | None = None, kv_blocks: int | None = None,
                 block_tokens: int | None = None, preempt: str | None = None, victim: str | None = None,
                 prefix_cache_gib: float | None = None, kv_cache_dir: str | None = None,
                 kv_cache_disk_gib: float | None = None, kv_dtype: str | None = None, **_ignored: Any) -> None:
        if prompt_tokens <= 0 or max_tokens < 0:
            raise FakError(f"inkernel: prompt_tokens must be > 0 and max_tokens >= 0 (got {prompt_tokens}, {max_tokens})")
        self.gguf = gguf or os.environ.get("FAK_MODEL") or os.environ.get("FAK_MODEL_DIR") or "synthetic"
        self.resident, self.prompt_tokens, self.max_tokens = resident, prompt_tokens, max_tokens
        self._boot: Any = None
        self._lock = threading.Lock()
        from fak.runtime.boot import SchedOptions

        try:  # a bad scheduler option is a boot error (one line, exit 2), not an error result on every call
            self.sched_options = SchedOptions.resolve(max_running=max_running, kv_blocks=kv_blocks,
                                                      block_tokens=block_tokens, preempt=preempt, victim=victim,
                                                      prefix_cache_gib=prefix_cache_gib, kv_cache_dir=kv_cache_dir,
                                                      kv_cache_disk_gib=kv_cache_disk_gib, kv_dtype=kv_dtype)
        except FakError as exc:
            raise FakError(f"inkernel: {exc}") from None

    @property
    def model_name(self) -> str:
        return self.gguf

    def preload(self) -> None:
        """Boot now: model, tokenizer, scheduler (its KV pool); raises FakError with one line if it cannot."""
        self._booted()

    def _booted(self) -> Any:
        with self._lock:
            if self._boot is None:
                from fak.runtime.boot import boot

                try:  # a weights-only GGUF gets the byte tokenizer: prompt bytes as ids
                    self._boot = boot(self.gguf, resident=self.resident, sched=self.sched_options, show=False,
                                      bytes_fallback=True)
                except FakError as exc:
                    raise FakError(f"inkernel: {exc}") from None
            return self._boot

    def caps(self) -> dict[str, Any]:
        return {"engine": "inkernel", "streaming": True, "deterministic": True, "model": self.model_name,
                "loaded": self._boot is not None, "max_tokens": self.max_tokens, "prompt_tokens": self.prompt_tokens,
                "scheduler": self.sched_options.as_kwargs()}

    def prompt_ids(self, call: ToolCall) -> list[int]:
        b = self._booted()
        ids = [int(i) % b.model.config.vocab_size for i in b.tokenizer.encode(_prompt(call))]
        return ids[: self.prompt_tokens] or [0]

    def scheduler(self) -> Any:
        """The engine's NativeScheduler (booted with the model on first use)."""
        return self._booted().scheduler

    def admit(self, call: ToolCall) -> _InKernelRequest:
        """Queue the call on the scheduler; iterate the request for text pieces, then take result()."""
        from engine.errors import EngineError
        from engine.sched.lane import Request

        try:
            sched = self.scheduler()
            ids = self.prompt_ids(call)
            if self.max_tokens == 0:
                return _InKernelRequest(self, call, ids, None)
            handle = sched.admit(Request(ids, max_new_tokens=self.max_tokens, request_id=call.trace_id or ""))
        except FakError as exc:
            return _InKernelRequest(self, call, [], None, error=str(exc))
        except EngineError as exc:
            return _InKernelRequest(self, call, [], None, error=f"inkernel: {exc}")
        return _InKernelRequest(self, call, ids, handle)

    def complete(self, call: ToolCall) -> Result:
        return self.admit(call).result()

    def close(self) -> None:
        """Stop the scheduler (aborts requests in flight)."""
        if self._boot is not None:
            self._boot.close()


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
            payload["generated_text"] = e._booted().tokenizer.decode(out, skip_special=True)
        except Exception:  # a text view is optional; ids are the result
            pass
        meta = {"engine": "inkernel", "model": e.model_name, "input_tokens": len(self._ids),
                "output_tokens": len(out), "finish_reason": reason}
        if reason == "cancelled":
            meta["cancelled"] = True
        return Result(payload, Status.OK, meta)
