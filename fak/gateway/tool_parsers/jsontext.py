"""JSON inside model text: where a value ends (for streaming), and a decoded object as a Call.

Decoding is json.JSONDecoder's (raw_decode); `Extent` only tracks string/escape state and bracket
depth so a parser knows, incrementally, where an object or list ends or where a marker sits
outside JSON strings. Whether that text is valid JSON is decided by the decoder alone.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fak.gateway.tool_parsers.base import Call

WS = " \t\r\n"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# strict=False: models write raw newlines/tabs inside strings (code in arguments); the canonical
# json.dumps re-escapes them, so what we pass on is valid JSON either way. NaN/Infinity refused.
_DECODER = json.JSONDecoder(strict=False, parse_constant=_no_constant)

# what a JSON object that means to be a call starts with (used when no marker says so)
CALL_ATTEMPT = re.compile(r'\{\s*"(?:name|arguments|parameters)"\s*:')
_NAME = re.compile(r'"name"\s*:\s*"([^"\\]+)"')


def loads_exact(text: str) -> Any:
    """The one JSON value `text` holds (surrounding whitespace allowed); ValueError otherwise."""
    t = text.strip(WS)
    value, end = _DECODER.raw_decode(t)
    if end != len(t):
        raise ValueError(f"extra text after the JSON value at char {end}: {t[end:end + 20]!r}")
    return value


def decode_at(s: str, i: int) -> tuple[Any, int]:
    """The JSON value starting exactly at s[i] and the index just past it (ValueError if none)."""
    return _DECODER.raw_decode(s, i)


def skip_ws(s: str, i: int) -> int:
    n = len(s)
    while i < n and s[i] in WS:
        i += 1
    return i


def is_partial(s: str, i: int, *markers: str) -> bool:
    """s[i:] is a proper prefix of one of the markers (more text may complete it)."""
    rest = s[i:]
    return any(len(rest) < len(m) and m.startswith(rest) for m in markers)


_IN_STRING = re.compile(r'["\\]')


class Extent:
    """Incremental scan of JSON text from `start`: string/escape state and bracket depth only.

    `run(s)` continues where the last call stopped (s only ever grows at the end) and returns the
    index just past the bracket that closes the value opened at `start` or, when `stops` are
    given, the index of a stop character met outside strings (brackets are then not matched); None
    when s ran out first. After a stop, `skip()` moves past it.
    """

    def __init__(self, start: int, stops: str = "") -> None:
        self.pos = start
        self.depth = 0
        self.in_string = False
        self.end: int | None = None  # once the value has closed
        self._outside = re.compile("[" + re.escape('"{}[]' + stops) + "]")
        self._stops = stops

    def run(self, s: str) -> int | None:
        if self.end is not None:
            return self.end
        while True:
            if self.in_string:
                m = _IN_STRING.search(s, self.pos)
                if m is None:
                    self.pos = len(s)
                    return None
                if m.group() == "\\":
                    if m.end() >= len(s):  # the escaped character has not arrived yet
                        self.pos = m.start()
                        return None
                    self.pos = m.end() + 1
                    continue
                self.in_string = False
                self.pos = m.end()
                continue
            m = self._outside.search(s, self.pos)
            if m is None:
                self.pos = len(s)
                return None
            c = m.group()
            if c in self._stops:
                self.pos = m.start()
                return m.start()
            self.pos = m.end()
            if c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth == 0 and not self._stops:
                    self.end = self.pos
                    return self.pos

    def skip(self) -> None:
        self.pos += 1


def marked_call(text: str, raw: str) -> Call:
    """The JSON text behind a call marker as a Call: anything but a well-formed call has an error."""
    try:
        obj = loads_exact(text)
    except ValueError as e:
        m = _NAME.search(text)  # best effort, for the error report only
        return Call(m.group(1) if m else "", "", raw, f"bad JSON: {e}")
    if not isinstance(obj, dict):
        return Call("", "", raw, f"not a JSON object but a {_kind(obj)}")
    return call_from(obj.get("name"), obj.get("arguments", obj.get("parameters", {})), raw)


def bare_call(text: str, raw: str) -> Call | None:
    """Bare JSON text (no marker) as a Call, or None when it is not a call at all (plain text).

    It is a call attempt when it starts with a "name"/"arguments"/"parameters" key or decodes to an
    object with one of them; other JSON, and text that is not JSON, is text.
    """
    try:
        obj = loads_exact(text)
    except ValueError:
        return marked_call(text, raw) if CALL_ATTEMPT.match(text.strip(WS)) else None
    if not isinstance(obj, dict) or not {"name", "arguments", "parameters"} & obj.keys():
        return None
    return marked_call(text, raw)


def call_from(name: Any, args: Any, raw: str) -> Call:
    """A call from a decoded name and arguments value, validated."""
    if not isinstance(name, str) or not name:
        why = "missing name" if name is None else f"name is not a non-empty string: {json.dumps(name)}"
        return Call("", "", raw, why)
    if isinstance(args, str):  # the OpenAI wire form: arguments as a string of JSON
        try:
            args = loads_exact(args)
        except ValueError as e:
            return Call(name, "", raw, f"arguments is a string that is not JSON: {e}")
    if not isinstance(args, dict):
        return Call(name, "", raw, f"arguments is not a JSON object but a {_kind(args)}")
    return Call(name, json.dumps(args, ensure_ascii=False), raw)


def _kind(v: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), "number")
