"""Mistral: `[TOOL_CALLS]` and then the calls, in either of Mistral's two layouts.

Accepted after each `[TOOL_CALLS]` (which may follow prose):
- a JSON list of `{"name": ..., "arguments": {...}}` objects (tokenizers before v11; an "id" key
  is ignored), or one such object alone;
- `name[ARGS]{...}` (v11+), also `name[CALL_ID]id[ARGS]{...}`, and `name{...}` (the same with the
  control tokens decoded away). Several calls repeat the marker: `[TOOL_CALLS]a[ARGS]{..}[TOOL_CALLS]b..`.
Whitespace after a call is held: dropped before the next `[TOOL_CALLS]` or the end, else text.
Each call's `raw` is its own text: a list element's JSON, or `[TOOL_CALLS]name[ARGS]{...}`.

Malformed: a list that is not valid JSON (one Call for the whole list), an element that is not a
call object, a name not followed by `[ARGS]`/`{`, arguments that are not a JSON object, or a list
or object not closed by the end of output.
"""

from __future__ import annotations

import re

from fak.gateway.tool_parsers.base import Call, StreamParser
from fak.gateway.tool_parsers.jsontext import (
    Extent,
    call_from,
    decode_at,
    is_partial,
    loads_exact,
    marked_call,
    skip_ws,
)

TAG, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]*")
_ID = re.compile(r"[A-Za-z0-9]*")


class MistralParser(StreamParser):
    def __init__(self) -> None:
        super().__init__()
        self._state = "text"  # text | gap (after a call) | tag (_buf starts with TAG) | json | args | bad
        self._at = 0  # json/args: where the JSON value starts in _buf
        self._name = ""  # args/bad: the tool name read before [ARGS]
        self._why = ""  # bad: what was wrong
        self._scan: Extent | None = None

    def _step(self, final: bool) -> bool:
        if not self._buf:
            return False
        return getattr(self, "_on_" + self._state)(final)

    def _on_text(self, final: bool) -> bool:
        found, progressed = self._text_before(TAG, final)
        if found:
            self._state = "tag"
        return progressed

    def _on_gap(self, final: bool) -> bool:
        i = skip_ws(self._buf, 0)
        if self._buf.startswith(TAG, i):
            self._buf = self._buf[i:]
            self._state = "tag"
            return True
        if i == len(self._buf):
            if final:
                self._buf = ""
            return final
        if not final and is_partial(self._buf, i, TAG):
            return False
        self._state = "text"
        return True

    def _on_tag(self, final: bool) -> bool:
        buf = self._buf
        i = skip_ws(buf, len(TAG))
        if i == len(buf):
            if final:
                self._call(Call("", "", buf, "[TOOL_CALLS] with nothing after it"), len(buf))
            return final
        if buf[i] in "[{":
            self._state, self._at, self._scan = "json", i, Extent(i)
            return True
        name = _NAME.match(buf, i)
        j = skip_ws(buf, name.end())
        if buf.startswith(CALL_ID, j):
            j = skip_ws(buf, _ID.match(buf, j + len(CALL_ID)).end())
        after_args = buf.startswith(ARGS, j)
        if after_args:
            j = skip_ws(buf, j + len(ARGS))
        self._name = name.group()
        if j == len(buf) or is_partial(buf, j, ARGS, CALL_ID):  # more of the name, id or [ARGS] may come
            if not final:
                return False
            self._call(Call(self._name, "", buf, "unterminated: no arguments after the tool name"), len(buf))
            return True
        if buf[j] == "{":
            self._state, self._at, self._scan = "args", j, Extent(j)
        else:
            self._state = "bad"
            self._why = ("the arguments after [ARGS] are not a JSON object" if after_args else
                         "expected [ARGS] or a JSON object after the tool name" if self._name else
                         "expected a tool name or JSON after [TOOL_CALLS]")
        return True

    def _on_bad(self, final: bool) -> bool:
        """A name without [ARGS]{...}: the call is malformed up to the next [TOOL_CALLS] or the end."""
        cut = self._buf.find(TAG, len(TAG))
        if cut < 0 and not final:
            return False
        cut = len(self._buf) if cut < 0 else cut
        self._call(Call(self._name, "", self._buf[:cut], self._why), cut)
        self._state = "tag"
        return True

    def _on_args(self, final: bool) -> bool:
        assert self._scan is not None
        end = self._scan.run(self._buf)
        if end is None:
            if final:
                self._call(Call(self._name, "", self._buf,
                                "unterminated: the arguments object is not closed at the end of output"),
                           len(self._buf))
            return final
        raw = self._buf[:end]
        try:
            call = call_from(self._name, loads_exact(self._buf[self._at:end]), raw)
        except ValueError as e:
            call = Call(self._name, "", raw, f"bad JSON in the arguments: {e}")
        self._call(call, end)
        self._state = "gap"
        return True

    def _on_json(self, final: bool) -> bool:
        assert self._scan is not None
        buf, at = self._buf, self._at
        end = self._scan.run(buf)
        if end is None:
            if final:
                self._call(Call("", "", buf, "unterminated: the JSON after [TOOL_CALLS] is not closed at the end of output"),
                           len(buf))
            return final
        if buf[at] == "{":
            self._out.append(marked_call(buf[at:end], buf[at:end]))
        else:
            self._out.extend(_list_calls(buf[:end], at))
        self._buf = buf[end:]
        self._state = "gap"
        return True


def _list_calls(s: str, at: int) -> list[Call]:
    """The calls of the JSON list s[at:] (s[:at] is the marker): one per element, each with its own text."""
    try:
        items = loads_exact(s[at:])
    except ValueError as e:
        return [Call("", "", s, f"bad JSON: {e}")]
    if not isinstance(items, list):  # cannot happen: it starts with '[' and decoded
        return [Call("", "", s, "not a JSON list")]
    out: list[Call] = []
    i = skip_ws(s, at + 1)
    for _ in items:  # walk again for each element's exact text (the decoder gives its end)
        _, end = decode_at(s, i)
        out.append(marked_call(s[i:end], s[i:end]))
        i = skip_ws(s, end)
        i = skip_ws(s, i + 1) if i < len(s) and s[i] == "," else i
    return out
