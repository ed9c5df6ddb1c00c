"""`inkernel` engine: a tool call completes on a model living in this process.

The model is built on first use (importing this module costs nothing heavy) or at boot via
`preload()`. Which model: `gguf` (path or alias) if given, else $FAK_MODEL / $FAK_MODEL_DIR, else
the deterministic synthetic checkpoint (so a trace runs with no model file; set FAK_MODEL=gemma3-270m
for the real one). The call's arguments become a bounded prompt (at most `prompt_tokens` ids,
bytes when no tokenizer is installed), decoded greedily for up to `max_tokens` tokens.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from fak.abi import Result, Status, ToolCall
from fak.errors import FakError


def _prompt_text(call: ToolCall) -> str:
    try:
        obj = call.args_obj
    except ValueError:
        return f"{call.tool} {call.args.decode('utf-8', 'replace')}"
    if isinstance(obj, dict):
        if isinstance(obj.get("prompt"), str):
            return obj["prompt"]
        msgs = obj.get("messages")
        if isinstance(msgs, list) and msgs and isinstance(msgs[-1], dict):
            return str(msgs[-1].get("content", ""))
    return f"{call.tool} {call.args.decode('utf-8', 'replace')}"


class InKernelEngine:
    engine_id = "inkernel"

    def __init__(self, gguf: str | None = None, resident: bool = False, prompt_tokens: int = 64,
                 max_tokens: int = 16, **_ignored: Any) -> None:
        if prompt_tokens <= 0 or max_tokens < 0:
            raise FakError(f"inkernel: prompt_tokens must be > 0 and max_tokens >= 0 (got {prompt_tokens}, {max_tokens})")
        self.gguf = gguf or os.environ.get("FAK_MODEL") or os.environ.get("FAK_MODEL_DIR") or "synthetic"
        self.resident, self.prompt_tokens, self.max_tokens = resident, prompt_tokens, max_tokens
        self._model: Any = None
        self._codec: Any = None
        self._lock = threading.Lock()

    @property
    def model_name(self) -> str:
        return self.gguf

    def preload(self) -> None:
        """Build the model now (boot); raises FakError with one line if it cannot."""
        from engine.errors import EngineError

        try:
            self._ensure()
        except EngineError as exc:
            raise FakError(f"inkernel: {exc}") from None

    def _ensure(self) -> tuple[Any, Any]:
        if self._model is None:
            from engine import load_model
            from engine.aliases import resolve_model
            from engine.generate import ByteCodec, codec_for

            if self.gguf == "synthetic":
                model, path = load_model("synthetic"), None
            else:
                path = resolve_model(self.gguf)
                model = load_model(str(path), resident=self.resident)
            codec = codec_for(model, path)
            self._codec = codec if codec is not None else ByteCodec()
            self._model = model
        return self._model, self._codec

    def caps(self) -> dict[str, Any]:
        return {"engine": "inkernel", "streaming": False, "deterministic": True, "model": self.model_name,
                "loaded": self._model is not None, "max_tokens": self.max_tokens, "prompt_tokens": self.prompt_tokens}

    def prompt_ids(self, call: ToolCall) -> list[int]:
        model, codec = self._ensure()
        ids = [int(i) % model.config.vocab_size for i in codec.encode(_prompt_text(call))]
        return ids[: self.prompt_tokens] or [0]

    def complete(self, call: ToolCall) -> Result:
        from engine.errors import EngineError
        from engine.generate import Generation

        try:
            with self._lock:
                model, codec = self._ensure()
                ids = self.prompt_ids(call)
                stop = tuple(getattr(codec, "eos_ids", ()) or ())
                out = list(Generation(model, ids, self.max_tokens, stop_ids=stop))
        except EngineError as exc:
            return Result.error(f"inkernel: {exc}", engine="inkernel")
        payload: dict[str, Any] = {"tool": call.tool, "engine": "inkernel", "model": self.model_name,
                                   "generated_tokens": out}
        try:
            payload["generated_text"] = codec.decode(out, skip_special=True)
        except Exception:  # a text view is optional; ids are the result
            pass
        meta = {"engine": "inkernel", "model": self.model_name, "input_tokens": len(ids), "output_tokens": len(out)}
        return Result(payload, Status.OK, meta)
