"""Hermes / Qwen2.5: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

Accepted: any number of tagged calls, with text before, between and after them. A call ends at
the first `</tool_call>` outside a JSON string (so the tag may appear inside argument values), and
its body must be exactly one JSON object with "name" and "arguments" (or "parameters"). Also a
reply that is, as a whole, one untagged JSON call, bare or in a ```json fence (what Qwen2.5-Coder
sometimes writes), decided as in generic.py; untagged JSON inside prose stays text.

Whitespace right after a call is held: dropped if another call or the end follows, given back
as text if prose follows. Malformed: a body that is not a JSON call object, a new `<tool_call>`
before the `</tool_call>` (outside strings), or no `</tool_call>` by the end of output. When the
end comes inside a JSON string that a `</tool_call>` appears in, the call is cut at that tag
(reported malformed) and the text after it is parsed again.
"""

from __future__ import annotations

from fak.gateway.tool_parsers.base import Call, StreamParser
from fak.gateway.tool_parsers.generic import TEXT, WAIT, BareReply
from fak.gateway.tool_parsers.jsontext import (
    Extent,
    is_partial,
    marked_call,
    skip_ws,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesParser(StreamParser):
    def __init__(self) -> None:
        super().__init__()
        self._state = "start"  # start (maybe a bare JSON reply) | text | call | gap (after a call)
        self._bare = BareReply()
        self._scan: Extent | None = None  # in a call: _buf starts with OPEN

    def _step(self, final: bool) -> bool:
        if not self._buf:
            return False
        return getattr(self, "_on_" + self._state)(final)

    def _on_start(self, final: bool) -> bool:
        v = self._bare.verdict(self._buf, final)
        if v == WAIT:
            return False
        if v == TEXT:
            self._state = "text"
            return True
        assert isinstance(v, Call)
        self._call(v, len(self._buf))
        return True

    def _on_text(self, final: bool) -> bool:
        found, progressed = self._text_before(OPEN, final)
        if found:
            self._state, self._scan = "call", None
        return progressed

    def _on_gap(self, final: bool) -> bool:
        i = skip_ws(self._buf, 0)
        if self._buf.startswith(OPEN, i):
            self._buf = self._buf[i:]
            self._state, self._scan = "call", None
            return True
        if i == len(self._buf):
            if not final:
                return False
            self._buf = ""  # trailing whitespace after the last call
            return True
        if not final and is_partial(self._buf, i, OPEN):
            return False
        self._state = "text"
        return True

    def _on_call(self, final: bool) -> bool:
        buf = self._buf
        if self._scan is None:
            self._scan = Extent(len(OPEN), stops="<")
        while True:
            at = self._scan.run(buf)
            if at is None:
                break
            if buf.startswith(CLOSE, at):
                end = at + len(CLOSE)
                self._call(marked_call(buf[len(OPEN):at], buf[:end]), end)
                self._state = "gap"
                return True
            if buf.startswith(OPEN, at):
                call = marked_call(buf[len(OPEN):at], buf[:at])
                self._call(Call(call.name, "", call.raw, "unterminated: a new <tool_call> began before </tool_call>"), at)
                self._scan = None
                return True
            if not final and is_partial(buf, at, OPEN, CLOSE):
                return False
            self._scan.skip()  # a '<' that is no tag: the body is not JSON, which the decoder will say
        if not final:
            return False
        cut = buf.find(CLOSE, len(OPEN))
        if cut >= 0:  # the end came inside a string; the first </tool_call> was meant to close it
            end = cut + len(CLOSE)
            self._call(marked_call(buf[len(OPEN):cut], buf[:end]), end)
            self._state = "gap"
            return True
        call = marked_call(buf[len(OPEN):], buf)
        self._call(Call(call.name, "", buf, "unterminated: no </tool_call> before the end of output"), len(buf))
        return True
