"""The model planner: an OpenAI-compatible chat endpoint with the tools offered as TOOL_SPECS, and the
in-kernel model served for it in this process (fak serve's app on a private loopback port).

The in-process app gets a kernel that allows every call: the agent loop's own kernel (fak arm) or no
kernel at all (baseline arm) is what judges, so both arms get the model's calls as the model wrote them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from openai import OpenAIError

from fak.agent.planner import Proposal, Turn
from fak.errors import FakError

SYSTEM = ("You are a coding agent working in a sandbox directory. Use the tools to do the task: call one tool, "
          "read its result, then decide the next step. When the task is done, reply with a one-line summary "
          "and no tool call.")


def client_for(base_url: str) -> Any:
    from openai import OpenAI

    url = base_url.rstrip("/")
    if not url.endswith("/v1"):
        url += "/v1"
    return OpenAI(base_url=url, api_key=os.environ.get("OPENAI_API_KEY") or "none", max_retries=0, timeout=600.0)


def first_model(client: Any) -> str:
    try:
        models = client.models.list().data
    except OpenAIError as exc:
        raise FakError(f"{client.base_url}: cannot list models: {type(exc).__name__}: {exc}") from None
    if not models:
        raise FakError(f"{client.base_url}: serves no model")
    return str(models[0].id)


@dataclass
class ModelPlanner:
    """Plans with a chat model: the conversation is system + task, then per turn the model's reply and
    one `tool` message per call holding what the loop shows (a `[fak]` note where the kernel stepped in)."""

    client: Any
    model: str
    instructions: str
    tools: list[dict[str, Any]]
    temperature: float = 0.0
    max_tokens: int = 512
    name: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.name = self.name or f"model:{self.model}"
        self.messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": self.instructions}]

    def next_turn(self) -> Turn:
        try:
            r = self.client.chat.completions.create(model=self.model, messages=self.messages, tools=self.tools,
                                                    temperature=self.temperature, max_tokens=self.max_tokens)
        except OpenAIError as exc:  # connection refused, a 4xx/5xx: one line, the arm cannot go on
            raise FakError(f"model {self.model}: {type(exc).__name__}: {exc}") from None
        msg = r.choices[0].message
        calls = [Proposal(tc.id, tc.function.name, tc.function.arguments or "{}") for tc in (msg.tool_calls or [])]
        entry: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
        if calls:
            entry["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.tool, "arguments": c.arguments}}
                                   for c in calls]
        self.messages.append(entry)
        u = r.usage
        return Turn(calls, msg.content or "", int(getattr(u, "prompt_tokens", 0) or 0),
                    int(getattr(u, "completion_tokens", 0) or 0))

    def warm(self) -> None:
        """One token on the opening prompt, not counted: the first arm would otherwise pay the warm-up
        (and the prefix cache the second arm finds filled) alone; now both start from the same cache."""
        try:
            self.client.chat.completions.create(model=self.model, messages=self.messages, tools=self.tools,
                                                temperature=self.temperature, max_tokens=1)
        except OpenAIError as exc:
            raise FakError(f"model {self.model}: {type(exc).__name__}: {exc}") from None

    def observe(self, call: Proposal, shown: str, failed: bool) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call.id, "content": shown})
