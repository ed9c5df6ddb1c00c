"""Server-sent events: parse an upstream's stream into (event, data) records and write them back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any


@dataclass
class Event:
    event: str | None  # the `event:` field (Anthropic and Responses name theirs; OpenAI Chat does not)
    data: str  # the `data:` lines joined by newlines

    def json(self) -> Any:
        return json.loads(self.data)


async def parse(lines: AsyncIterator[str]) -> AsyncIterator[Event]:
    """Events from a stream's lines (a blank line ends an event; `:` lines are comments)."""
    name: str | None = None
    data: list[str] = []
    async for line in lines:
        if line == "":
            if data:
                yield Event(name, "\n".join(data))
            name, data = None, []
        elif line.startswith(":"):
            continue
        else:
            key, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if key == "event":
                name = value
            elif key == "data":
                data.append(value)
    if data:  # a stream cut without its final blank line
        yield Event(name, "\n".join(data))


def frame(data: Any, event: str | None = None) -> bytes:
    """One event on the wire; `data` a JSON value (or an already-encoded string such as [DONE])."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()
