"""`mock` engine: a deterministic echo with token accounting. The reply to a call is
`meta["mock_reply"]` if given, else the prompt (args "prompt" or the last message's content),
else "<tool> <args JSON>". Tokens are whitespace-separated words (cheap, deterministic)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from fak.core.abi import OneShotRequest, Result, Status, ToolCall, prompt_text

_PIECE = re.compile(r"\s*\S+")


class MockEngine:
    """Echo engine. `reply` fixes every reply; `fail=True` makes every call an error Result."""

    engine_id = "mock"

    def __init__(self, reply: str | None = None, fail: bool = False, **_ignored: Any) -> None:
        self.reply, self.fail = reply, fail
        self.calls = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def caps(self) -> dict[str, Any]:
        return {"engine": "mock", "streaming": True, "deterministic": True}

    def _reply_text(self, call: ToolCall) -> tuple[str, str]:
        prompt = prompt_text(call)
        if prompt is None:
            prompt = call.args.decode("utf-8", "replace")
        if isinstance(call.meta.get("mock_reply"), str):
            return prompt, call.meta["mock_reply"]
        if self.reply is not None:
            return prompt, self.reply
        if call.op == "tool":
            return prompt, f"{call.tool} {call.args.decode('utf-8', 'replace')}"
        return prompt, prompt

    def complete(self, call: ToolCall) -> Result:
        self.calls += 1
        if self.fail:
            return Result.error("mock engine: configured to fail", engine="mock")
        prompt, text = self._reply_text(call)
        n_in, n_out = len(prompt.split()), len(text.split())
        self.prompt_tokens += n_in
        self.completion_tokens += n_out
        payload = {
            "tool": call.tool,
            "engine": "mock",
            "text": text,
            "usage": {"prompt_tokens": n_in, "completion_tokens": n_out},
        }
        return Result(payload, Status.OK, {"engine": "mock", "input_tokens": n_in, "output_tokens": n_out})

    def admit(self, call: ToolCall) -> MockRequest:
        return MockRequest(self, call)


class MockRequest(OneShotRequest):
    """Streams the mock reply word by word (leading whitespace kept, so pieces concatenate to the text)."""

    def tokens(self) -> Iterator[str]:
        res = self.result()
        if not res.ok:
            return
        for m in _PIECE.finditer(res.text):
            if self._cancelled:
                return
            yield m.group(0)
