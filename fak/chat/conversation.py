"""A conversation: the system prompt, the turns, the settings; saved and loaded as a JSON transcript."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fak.errors import FakError

VERSION = "fak-chat/v1"


@dataclass
class Conversation:
    system: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)  # OpenAI chat messages, without the system one
    temperature: float = 0.7
    tools: bool = False
    max_tokens: int = 1024  # per model call: a small model can ramble to the end of its context

    def wire(self) -> list[dict[str, Any]]:
        """What the model is sent: the system prompt first, then every turn."""
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.messages

    def reset(self) -> None:
        self.messages.clear()

    def save(self, path: str) -> None:
        doc = {"version": VERSION, "system": self.system, "temperature": self.temperature, "tools": self.tools,
               "messages": self.messages}
        try:
            Path(path).write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        except OSError as exc:
            raise FakError(f"{path}: cannot write the transcript: {exc.strerror or exc}") from None

    @classmethod
    def load(cls, path: str) -> Conversation:
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise FakError(f"{path}: cannot read the transcript: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise FakError(f"{path}: not a JSON transcript ({exc})") from None
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            raise FakError(f"{path}: not a fak chat transcript (expected version {VERSION!r})")
        msgs = doc.get("messages")
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and m.get("role") in ("user", "assistant", "tool")
                                                  for m in msgs):
            raise FakError(f"{path}: field 'messages': expected a list of user/assistant/tool messages")
        system = doc.get("system")
        temp = doc.get("temperature", 0.7)
        if system is not None and not isinstance(system, str):
            raise FakError(f"{path}: field 'system': expected a string")
        if not isinstance(temp, (int, float)) or isinstance(temp, bool):
            raise FakError(f"{path}: field 'temperature': expected a number")
        return cls(system, list(msgs), float(temp), bool(doc.get("tools", False)))
