"""`http` engine: an OpenAI-compatible upstream (`POST {base}/v1/chat/completions`) via httpx.

Configuration (options win over environment):
  base_url     / FAK_HTTP_BASE_URL     e.g. http://127.0.0.1:8080 or https://api.example.com/v1
  model        / FAK_HTTP_MODEL        model name sent upstream (default "default")
  api_key_env  / FAK_HTTP_API_KEY_ENV  NAME of the env var holding the API key (default OPENAI_API_KEY);
                                       the key itself never appears in options, logs or Results
  timeout      / FAK_HTTP_TIMEOUT      seconds (default 60)
A call's args become messages: args["messages"] if given, else args["prompt"] as one user message,
else "<tool> <args JSON>". args "max_tokens" / "temperature" pass through. Every upstream problem
(timeout, refused connection, HTTP >= 400, a body that is not a chat completion) is an error Result.
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx

from fak.core.abi import Result, Status, ToolCall
from fak.errors import FakError


def _endpoint(base_url: str) -> str:
    base = base_url.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    if not base.endswith("/v1"):
        base += "/v1"
    return base + "/chat/completions"


def _count(v: Any) -> int:
    """A token count from an upstream's usage block; anything but a non-negative integer counts as 0."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


class HttpEngine:
    engine_id = "http"

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        api_key_env: str | None = None,
        timeout: float | None = None,
        **_ignored: Any,
    ) -> None:
        base = base_url or os.environ.get("FAK_HTTP_BASE_URL")
        if not base:
            raise FakError("http engine: no upstream configured (set FAK_HTTP_BASE_URL or pass base_url)")
        if not base.startswith(("http://", "https://")):
            raise FakError(f"http engine: base URL {base!r} must start with http:// or https://")
        self.url = _endpoint(base)
        self.model = model or os.environ.get("FAK_HTTP_MODEL") or "default"
        self.api_key_env = api_key_env or os.environ.get("FAK_HTTP_API_KEY_ENV") or "OPENAI_API_KEY"
        try:
            self.timeout = float(timeout if timeout is not None else os.environ.get("FAK_HTTP_TIMEOUT", 60))
        except ValueError:
            raise FakError(
                f"http engine: FAK_HTTP_TIMEOUT must be a number, got {os.environ.get('FAK_HTTP_TIMEOUT')!r}") from None
        if not 0 < self.timeout < float("inf"):
            raise FakError(f"http engine: timeout must be a positive number of seconds, got {self.timeout:g}")
        self._client = httpx.Client(timeout=self.timeout)
        self.calls = 0

    def caps(self) -> dict[str, Any]:
        return {"engine": "http", "url": self.url, "model": self.model, "streaming": False}

    def _request(self, call: ToolCall) -> dict[str, Any]:
        try:
            args = call.args_obj
        except ValueError:
            args = {}
        if not isinstance(args, dict):
            args = {}
        if isinstance(args.get("messages"), list):
            messages = args["messages"]
        elif isinstance(args.get("prompt"), str):
            messages = [{"role": "user", "content": args["prompt"]}]
        else:
            messages = [{"role": "user", "content": f"{call.tool} {call.args.decode('utf-8', 'replace')}"}]
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        for k in ("max_tokens", "temperature"):
            if k in args:
                body[k] = args[k]
        return body

    def complete(self, call: ToolCall) -> Result:
        self.calls += 1
        headers = {"content-type": "application/json"}
        key = os.environ.get(self.api_key_env)
        if key:
            headers["authorization"] = f"Bearer {key}"
        meta = {"engine": "http", "url": self.url}
        try:
            resp = self._client.post(self.url, content=json.dumps(self._request(call)), headers=headers)
        except httpx.TimeoutException:
            return Result.error(f"http engine: timeout after {self.timeout:g}s ({self.url})", **meta)
        except httpx.ConnectError as exc:
            return Result.error(f"http engine: cannot connect to {self.url}: {exc}", **meta)
        except httpx.HTTPError as exc:
            return Result.error(f"http engine: {type(exc).__name__}: {exc} ({self.url})", **meta)
        if resp.status_code >= 400:
            return Result.error(f"http engine: upstream HTTP {resp.status_code}: {resp.text[:200]}",
                                status_code=resp.status_code, **meta)
        try:
            data = resp.json()
            text = data["choices"][0]["message"]["content"]
            if not isinstance(text, str):
                raise TypeError("content is not a string")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            return Result.error(f"http engine: upstream reply is not a chat completion ({type(exc).__name__}: {exc})", **meta)
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        n_in, n_out = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
        payload = {"tool": call.tool, "engine": "http", "model": data.get("model", self.model), "text": text,
                   "usage": {"prompt_tokens": n_in, "completion_tokens": n_out}}
        return Result(payload, Status.OK, {**meta, "input_tokens": n_in, "output_tokens": n_out})

    def close(self) -> None:
        self._client.close()
