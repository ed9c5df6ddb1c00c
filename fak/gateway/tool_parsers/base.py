"""The interface every tool-call parser implements, and the streaming loop they share.

A parser is fed the model's text as it is decoded and answers with events: `Text` that is safe
to show now, and `Call` once a tool call is complete. Decisions depend only on the text seen so
far, never on where the deltas were cut, so any chunking of one output gives the same events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Text:
    """Visible assistant text, safe to stream now (it can no longer turn into a call)."""

    text: str


@dataclass(frozen=True)
class Call:
    """One complete tool call.

    `arguments` is canonical JSON of an object (json.dumps of the parsed dict) when `error` is
    None; when the model's text was not a well-formed call, `arguments` is "" and `error` says why.
    `raw` is the exact model text the call came from (for journals and error messages).
    """

    name: str
    arguments: str
    raw: str
    error: str | None = None


Event = Text | Call


def held_suffix(s: str, *markers: str) -> int:
    """Length of the longest suffix of s that is a proper prefix of a marker (it may still become one)."""
    best = 0
    for m in markers:
        for k in range(min(len(s), len(m) - 1), best, -1):
            if s.endswith(m[:k]):
                best = k
                break
    return best


class ToolParser(Protocol):
    def feed(self, delta: str) -> list[Event]:
        """The next text delta of the output; returns what can be decided now."""
        ...

    def close(self) -> list[Event]:
        """End of generation: flushes held text; an unterminated call comes back as Call(error=...)."""
        ...


def merge(events: list[Event]) -> list[Event]:
    """Adjacent Text joined, empty Text dropped."""
    out: list[Event] = []
    for e in events:
        if isinstance(e, Text):
            if not e.text:
                continue
            if out and isinstance(out[-1], Text):
                out[-1] = Text(out[-1].text + e.text)
                continue
        out.append(e)
    return out


def parse_all(parser: ToolParser, text: str) -> list[Event]:
    """A whole (non-streamed) output: feed it at once, close, adjacent Text merged."""
    return merge(parser.feed(text) + parser.close())


class StreamParser:
    """The loop the families share: `_buf` holds the text not yet decided; `_step` decides a piece.

    `_step(final)` looks at the start of `_buf` (and the family's state), emits what it can decide
    with `_text`/`_call`, consumes it from `_buf`, and returns True if it made progress. It must
    only decide what no later text could change; with final=True (after close) everything is
    decided. The loop runs `_step` until it stops making progress.
    """

    def __init__(self) -> None:
        self._buf = ""
        self._out: list[Event] = []
        self._closed = False

    def feed(self, delta: str) -> list[Event]:
        if self._closed:
            raise RuntimeError("feed() after close()")
        self._buf += delta
        while self._step(False):
            pass
        return self._take()

    def close(self) -> list[Event]:
        if self._closed:
            return []
        self._closed = True
        while self._step(True):
            pass
        assert not self._buf, f"{type(self).__name__} left {self._buf!r} undecided at close"
        return self._take()

    def _step(self, final: bool) -> bool:
        raise NotImplementedError

    def _take(self) -> list[Event]:
        out, self._out = merge(self._out), []
        return out

    def _text(self, n: int) -> None:
        """The first n characters of the buffer are text."""
        if n:
            self._out.append(Text(self._buf[:n]))
            self._buf = self._buf[n:]

    def _text_before(self, marker: str, final: bool) -> tuple[bool, bool]:
        """Release the text before `marker` (all of it but a tail that could still start the marker).
        Returns (found: the buffer now starts with the marker, progressed)."""
        i = self._buf.find(marker)
        if i >= 0:
            self._text(i)
            return True, True
        keep = 0 if final else held_suffix(self._buf, marker)
        if keep == len(self._buf):
            return False, False
        self._text(len(self._buf) - keep)
        return False, True

    def _call(self, call: Call, n: int) -> None:
        """The first n characters of the buffer were this call (or its syntax)."""
        self._out.append(call)
        self._buf = self._buf[n:]
