"""The fallback parser: a reply that IS one JSON call object is a call; anything else is text.

Accepted, with whitespace around it: `{"name": ..., "arguments": {...}}` (or "parameters"), bare
or alone inside one ```json / ``` fence (the closing fence may be cut off by the end of output).
The reply must be the call and nothing else: JSON followed by prose is text, JSON in the middle
of prose is text. A reply that starts like a call (`{"name":` ...) but is not a well-formed one is
reported as a Call with an error. The verdict needs the whole reply, so the call (or the text,
once it can no longer be a call) comes out at close(); text that cannot be a call streams at once.
"""

from __future__ import annotations

import re

from fak.gateway.tool_parsers.base import Call, StreamParser
from fak.gateway.tool_parsers.jsontext import WS, Extent, bare_call, skip_ws

_FENCE_OPEN = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\r?\n")
_FENCE_OPEN_PARTIAL = re.compile(r"`{1,3}|```[ \t]*(?:j(?:s(?:o(?:n)?)?)?|J(?:S(?:O(?:N)?)?)?)?[ \t]*\r?")
_FENCE_TAIL = re.compile(r"[ \t\r\n]*(?:`{1,3}[ \t\r\n]*)?")  # what may follow a fenced object (a prefix of "```" + ws)

WAIT, TEXT = "wait", "text"


class BareReply:
    """Decides whether a reply (all of it, from its first character) is one bare/fenced JSON call.

    verdict(s, final) -> "wait" (need more text), "text" (it is not a call: everything is text), or
    the Call (only when final). s is the whole reply so far and only grows between calls.
    """

    def __init__(self) -> None:
        self._scan: Extent | None = None

    def verdict(self, s: str, final: bool) -> str | Call:
        more = TEXT if final else WAIT  # what to answer when the text so far is a viable beginning
        i = skip_ws(s, 0)
        if i == len(s):
            return more
        j, fenced = i, False
        if s[i] == "`":
            m = _FENCE_OPEN.match(s, i)
            if m is None:
                return more if _FENCE_OPEN_PARTIAL.fullmatch(s, i) else TEXT
            j, fenced = skip_ws(s, m.end()), True
            if j == len(s):
                return more
        if s[j] != "{":
            return TEXT
        k = skip_ws(s, j + 1)
        if k == len(s):
            return more
        if s[k] not in '"}':
            return TEXT
        if self._scan is None:
            self._scan = Extent(j)
        end = self._scan.run(s)
        if end is None:
            if not final:
                return WAIT
            call = bare_call(s[j:], s[i:].rstrip(WS))
            if call is None:
                return TEXT
            return Call(call.name, "", call.raw, "unterminated: the JSON object is not closed at the end of output")
        call = bare_call(s[j:end], s[i:].rstrip(WS))
        if call is None:
            return TEXT
        tail = _FENCE_TAIL if fenced else re.compile(r"[ \t\r\n]*")
        if not tail.fullmatch(s, end):
            return TEXT
        return call if final else WAIT


class GenericParser(StreamParser):
    """Plain text unless the whole reply is one JSON call (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._bare: BareReply | None = BareReply()  # None once the reply is known to be text

    def _step(self, final: bool) -> bool:
        if not self._buf:
            return False
        if self._bare is None:
            self._text(len(self._buf))
            return True
        v = self._bare.verdict(self._buf, final)
        if v == WAIT:
            return False
        if v == TEXT:
            self._bare = None
            return True
        assert isinstance(v, Call)
        self._call(v, len(self._buf))
        return True
