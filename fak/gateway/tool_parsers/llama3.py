"""Llama 3.x JSON tool calls: a reply that IS `{"name": ..., "parameters": {...}}` (or "arguments").

Accepted: one or more call objects at the start of the reply (after whitespace), separated by
`;` and/or whitespace, each optionally after `<|python_tag|>`; `<|python_tag|>` may also follow
prose. A JSON object at the start that is not call-shaped (no "name"/"arguments"/"parameters")
is text, as is a `{` not followed by `"` or `}`; JSON in the middle of prose is text. After the
calls, prose (if any) is text again.

Malformed: after `<|python_tag|>` anything but a JSON call (Llama's built-in tools write Python
there, e.g. `brave_search.call(query=...)`, which is not supported), a call-shaped object that is
not valid JSON or has no name / non-object arguments, or an object not closed by the end.
"""

from __future__ import annotations

from fak.gateway.tool_parsers.base import Call, StreamParser
from fak.gateway.tool_parsers.jsontext import (
    CALL_ATTEMPT,
    WS,
    Extent,
    bare_call,
    is_partial,
    marked_call,
    skip_ws,
)

TAG = "<|python_tag|>"


class Llama3JsonParser(StreamParser):
    def __init__(self) -> None:
        super().__init__()
        self._state = "start"  # start | gap (after a call) | text | tag (_buf starts with TAG) | obj | code
        self._at = 0  # obj: where the object starts in _buf
        self._raw_at = 0  # obj: where the call's raw text starts (the tag, if any)
        self._must = False  # obj: behind a tag, so anything but a call is a malformed call
        self._scan: Extent | None = None

    def _step(self, final: bool) -> bool:
        if not self._buf:
            return False
        return getattr(self, "_on_" + self._state)(final)

    def _on_start(self, final: bool) -> bool:
        return self._before_call(final, seps="")

    def _on_gap(self, final: bool) -> bool:
        return self._before_call(final, seps=";")

    def _before_call(self, final: bool, seps: str) -> bool:
        """Whitespace (and separators): a call may come next; else what follows is text."""
        buf = self._buf
        i = 0
        while i < len(buf) and (buf[i] in WS or buf[i] in seps):
            i += 1
        if i == len(buf):
            if not final:
                return False
            if self._state == "start":
                self._text(i)  # a reply of only whitespace
            else:
                self._buf = ""  # trailing separators after the last call
            return True
        if buf.startswith(TAG, i):
            self._buf = buf[i:]
            self._state = "tag"
            return True
        if not final and is_partial(buf, i, TAG):
            return False
        if buf[i] == "{":
            k = skip_ws(buf, i + 1)
            if k == len(buf) and not final:
                return False
            if k == len(buf) or buf[k] in '"}':
                self._open(i, i, must=False)
                return True
        self._state = "text"
        return True

    def _on_text(self, final: bool) -> bool:
        found, progressed = self._text_before(TAG, final)
        if found:
            self._state = "tag"
        return progressed

    def _on_tag(self, final: bool) -> bool:
        i = skip_ws(self._buf, len(TAG))
        if i == len(self._buf):
            if not final:
                return False
            self._call(Call("", "", self._buf, "<|python_tag|> with nothing after it"), len(self._buf))
            return True
        if self._buf[i] == "{":
            self._open(i, 0, must=True)
        else:
            self._state = "code"
        return True

    def _on_code(self, final: bool) -> bool:
        if not final:
            return False
        why = "<|python_tag|> followed by code, not a JSON call (built-in tools are not supported)"
        self._call(Call("", "", self._buf, why), len(self._buf))
        return True

    def _open(self, at: int, raw_at: int, must: bool) -> None:
        self._state, self._at, self._raw_at, self._must = "obj", at, raw_at, must
        self._scan = Extent(at)

    def _on_obj(self, final: bool) -> bool:
        assert self._scan is not None
        buf, at = self._buf, self._at
        end = self._scan.run(buf)
        if end is None:
            if not final:
                return False
            if not (self._must or CALL_ATTEMPT.match(buf, at)):
                self._state = "text"
                return True
            call = marked_call(buf[at:], buf[self._raw_at:])
            self._call(Call(call.name, "", call.raw, "unterminated: the JSON object is not closed at the end of output"),
                       len(buf))
            return True
        text, raw = buf[at:end], buf[self._raw_at:end]
        call = marked_call(text, raw) if self._must else bare_call(text, raw)
        if call is None:  # JSON, but not a call: text, and no more calls are looked for before a tag
            self._text(end)
            self._state = "text"
            return True
        self._call(call, end)
        self._state = "gap"
        return True
