"""Tool-call parsers (fak/gateway/tool_parsers) on recorded model outputs, per family.

Every recorded output is parsed whole, then fed split at every point, in seeded random chunkings
and character by character: the calls and the concatenated text must be the same every time.
Malformed outputs must come back as a Call with an error, never as a well-formed call.
"""

from __future__ import annotations

import json
import random
import zlib
from typing import Any

import pytest

from fak.gateway.tool_parsers import (
    Call,
    GenericParser,
    HermesParser,
    Llama3JsonParser,
    MistralParser,
    Text,
    family_for,
    parse_all,
    parser_for,
)
from fak.gateway.tool_parsers.base import merge

H, L, M, G = HermesParser, Llama3JsonParser, MistralParser, GenericParser


def ok(name: str, args: dict[str, Any]) -> tuple[str, str, Any]:
    return ("call", name, args)


def bad(name: str, why: str) -> tuple[str, str, Any]:
    return ("bad", name, why)  # why: a substring of Call.error


def qwen(name: str, args: Any) -> str:
    """A call exactly as Qwen2.5's chat template asks for it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>"


PARIS = {"city": "Paris"}
WEATHER = qwen("get_weather", PARIS)
NESTED = {"title": "Sync", "when": {"start": "2025-03-01T10:00", "end": "2025-03-01T10:30", "tz": {"name": "CET"}},
          "attendees": [{"email": "a@example.com", "optional": False}, {"email": "b@example.com"}],
          "flags": {"remind": True, "minutes": [5, 10], "note": None}}

# (id, parser, recorded output, expected events: a str is Text, a tuple a call)
CASES: list[tuple[str, type, str, list[Any]]] = [
    # --- Hermes / Qwen2.5 ---
    ("h_single", H, WEATHER, [ok("get_weather", PARIS)]),
    ("h_text_before", H, "I'll check the current weather in Paris for you.\n" + WEATHER,
     ["I'll check the current weather in Paris for you.\n", ok("get_weather", PARIS)]),
    ("h_two_calls", H, WEATHER + "\n" + qwen("get_time", {"tz": "Europe/Paris"}) + "\n",
     [ok("get_weather", PARIS), ok("get_time", {"tz": "Europe/Paris"})]),
    ("h_text_between_after", H,
     "First the weather:\n" + WEATHER + "\nThen the exchange rate:\n" + qwen("fx", {"from": "EUR", "to": "USD"})
     + "\nBoth are on their way.",
     ["First the weather:\n", ok("get_weather", PARIS), "\nThen the exchange rate:\n",
      ok("fx", {"from": "EUR", "to": "USD"}), "\nBoth are on their way."]),
    ("h_unicode", H, "Je regarde 🌦️…\n" + qwen("get_weather", {"city": "Zürich", "note": "東京 → ☔", "emoji": "🌧️"}),
     ["Je regarde 🌦️…\n", ok("get_weather", {"city": "Zürich", "note": "東京 → ☔", "emoji": "🌧️"})]),
    ("h_unicode_escapes", H,
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "S\\u00e3o Paulo \\ud83c\\udf27"}}\n</tool_call>',
     [ok("get_weather", {"city": "São Paulo 🌧"})]),
    ("h_escaped_quotes_braces", H,
     '<tool_call>\n{"name": "run", "arguments": {"cmd": "echo \\"{not: json}\\" } ] && dir C:\\\\tmp\\\\"}}\n</tool_call>',
     [ok("run", {"cmd": 'echo "{not: json}" } ] && dir C:\\tmp\\'})]),
    ("h_tags_inside_strings", H,
     qwen("write_file", {"path": "calls.xml", "content": "<tool_call>\n{\"name\": \"x\"}\n</tool_call>"}),
     [ok("write_file", {"path": "calls.xml", "content": "<tool_call>\n{\"name\": \"x\"}\n</tool_call>"})]),
    ("h_nested", H, qwen("create_event", NESTED), [ok("create_event", NESTED)]),
    ("h_raw_newline_in_string", H,
     '<tool_call>\n{"name": "write_file", "arguments": {"path": "f.py", "content": "def f():\n\treturn 1\n"}}\n</tool_call>',
     [ok("write_file", {"path": "f.py", "content": "def f():\n\treturn 1\n"})]),
    ("h_arguments_as_json_string", H,
     '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n</tool_call>',
     [ok("get_weather", PARIS)]),
    ("h_no_arguments", H, '<tool_call>\n{"name": "get_time"}\n</tool_call>', [ok("get_time", {})]),
    ("h_compact_no_newlines", H, 'Ok.<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>',
     ["Ok.", ok("get_weather", PARIS)]),
    ("h_plain", H, "Paris is sunny today, 21 °C. Anything else?", ["Paris is sunny today, 21 °C. Anything else?"]),
    ("h_angle_brackets_in_text", H, "if a <b and x<tool or </tool_call> <tool_ca",
     ["if a <b and x<tool or </tool_call> <tool_ca"]),
    ("h_whitespace_only", H, " \n ", [" \n "]),
    ("h_bare_json_reply", H, '{"name": "get_weather", "arguments": {"city": "Paris"}}', [ok("get_weather", PARIS)]),
    ("h_fenced_json_reply", H, '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\n',
     [ok("get_weather", PARIS)]),
    ("h_fenced_cut_off", H, '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n``', [ok("get_weather", PARIS)]),
    ("h_json_example_in_prose", H, 'You would call:\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
     ['You would call:\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```']),
    ("h_bare_json_then_prose", H, '{"name": "get_weather", "arguments": {"city": "Paris"}}\nThat is the call.',
     ['{"name": "get_weather", "arguments": {"city": "Paris"}}\nThat is the call.']),
    ("h_bare_json_not_a_call", H, '{"city": "Paris", "temp_c": 21}', ['{"city": "Paris", "temp_c": 21}']),
    ("h_python_fence", H, "```python\nprint({'a': 1})\n```", ["```python\nprint({'a': 1})\n```"]),
    ("h_json_text_then_tag", H, '{"a": 1} and then ' + WEATHER, ['{"a": 1} and then ', ok("get_weather", PARIS)]),
    # malformed
    ("h_truncated_json", H, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>',
     [bad("get_weather", "bad JSON")]),
    ("h_single_quotes", H, "<tool_call>\n{'name': 'get_weather', 'arguments': {'city': 'Paris'}}\n</tool_call>",
     [bad("", "bad JSON")]),
    ("h_arguments_not_object", H, qwen("get_weather", ["Paris"]), [bad("get_weather", "not a JSON object but a list")]),
    ("h_arguments_plain_string", H, qwen("get_weather", "Paris"), [bad("get_weather", "string that is not JSON")]),
    ("h_missing_name", H, '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>', [bad("", "missing name")]),
    ("h_name_not_string", H, '<tool_call>\n{"name": 7, "arguments": {}}\n</tool_call>', [bad("", "name is not")]),
    ("h_nan", H, '<tool_call>\n{"name": "f", "arguments": {"x": NaN}}\n</tool_call>', [bad("f", "NaN")]),
    ("h_list_body", H, '<tool_call>\n[{"name": "get_weather", "arguments": {"city": "Paris"}}]\n</tool_call>',
     [bad("", "not a JSON object but a list")]),
    ("h_python_call_body", H, '<tool_call>\nget_weather(city="Paris")\n</tool_call>', [bad("", "bad JSON")]),
    ("h_trailing_junk_in_body", H, '<tool_call>\n{"name": "f", "arguments": {}} extra\n</tool_call>', [bad("f", "bad JSON")]),
    ("h_unterminated_tag", H, "Checking.\n" + WEATHER[: -len("</tool_call>")],
     ["Checking.\n", bad("get_weather", "no </tool_call>")]),
    ("h_truncated_mid_string", H, 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa',
     ["Checking.\n", bad("get_weather", "no </tool_call>")]),
    ("h_new_call_before_close", H, WEATHER[: -len("</tool_call>")] + qwen("get_time", {}),
     [bad("get_weather", "new <tool_call>"), ok("get_time", {})]),
    ("h_unclosed_string_then_tag", H, '<tool_call>\n{"name": "f", "arguments": {"x": "oops}}\n</tool_call>\nAfter.',
     [bad("f", "Unterminated string"), "\nAfter."]),
    ("h_bare_truncated", H, '{"name": "get_weather", "arguments": {"city": "Par', [bad("get_weather", "unterminated")]),
    ("h_bare_missing_name", H, '{"arguments": {"city": "Paris"}}', [bad("", "missing name")]),
    # --- Llama 3.x JSON ---
    ("l_single", L, '{"name": "get_weather", "parameters": {"city": "Paris"}}', [ok("get_weather", PARIS)]),
    ("l_arguments_key", L, '{"name": "get_weather", "arguments": {"city": "Paris"}}', [ok("get_weather", PARIS)]),
    ("l_leading_ws", L, '\n\n {"name": "get_weather", "parameters": {"city": "Paris"}}\n', [ok("get_weather", PARIS)]),
    ("l_two_semicolon", L, '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}',
     [ok("get_weather", PARIS), ok("get_time", {})]),
    ("l_two_newline", L, '{"name": "get_weather", "parameters": {"city": "Paris"}}\n{"name": "get_time", "parameters": {}}',
     [ok("get_weather", PARIS), ok("get_time", {})]),
    ("l_python_tag", L, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', [ok("get_weather", PARIS)]),
    ("l_python_tag_twice", L,
     '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
     '<|python_tag|>{"name": "get_time", "parameters": {}}',
     [ok("get_weather", PARIS), ok("get_time", {})]),
    ("l_text_then_tag", L, 'Let me look that up. <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
     ["Let me look that up. ", ok("get_weather", PARIS)]),
    ("l_unicode_escapes_nested", L,
     json.dumps({"name": "create_event", "parameters": dict(NESTED, title='Réunion "Q1" {draft}')}),
     [ok("create_event", dict(NESTED, title='Réunion "Q1" {draft}'))]),
    ("l_call_then_text", L, '{"name": "get_weather", "parameters": {"city": "Paris"}}\n\nI called the weather tool.',
     [ok("get_weather", PARIS), "\n\nI called the weather tool."]),
    ("l_plain", L, "The weather in Paris is sunny.", ["The weather in Paris is sunny."]),
    ("l_brace_prose", L, "{hello} is a set literal", ["{hello} is a set literal"]),
    ("l_json_not_a_call", L, '{"temperature": 21, "unit": "C"}', ['{"temperature": 21, "unit": "C"}']),
    ("l_json_in_prose", L, 'The call would be {"name": "get_weather", "parameters": {}}.',
     ['The call would be {"name": "get_weather", "parameters": {}}.']),
    # malformed
    ("l_builtin_code", L, '<|python_tag|>brave_search.call(query="weather in Paris")', [bad("", "code, not a JSON call")]),
    ("l_tag_only", L, "<|python_tag|>", [bad("", "nothing after it")]),
    ("l_truncated", L, '{"name": "get_weather", "parameters": {"city": "Par', [bad("get_weather", "unterminated")]),
    ("l_parameters_list", L, '{"name": "get_weather", "parameters": ["Paris"]}', [bad("get_weather", "list")]),
    ("l_missing_name", L, '{"parameters": {"city": "Paris"}}', [bad("", "missing name")]),
    ("l_single_quotes", L, "{\"name\": \"get_weather\", \"parameters\": {'city': 'Paris'}}", [bad("get_weather", "bad JSON")]),
    ("l_second_truncated", L, '{"name": "get_time", "parameters": {}}; {"name": "get_weather", "parameters": {"ci',
     [ok("get_time", {}), bad("get_weather", "unterminated")]),
    # --- Mistral ---
    ("m_list_one", M, '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]', [ok("get_weather", PARIS)]),
    ("m_list_two_ids", M,
     ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1B2c3D4e"}, '
      '{"name": "get_time", "arguments": {"tz": "CET"}, "id": "Z9y8X7w6v"}]'),
     [ok("get_weather", PARIS), ok("get_time", {"tz": "CET"})]),
    ("m_text_before", M, 'Sure, checking. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
     ["Sure, checking. ", ok("get_weather", PARIS)]),
    ("m_single_object", M, '[TOOL_CALLS] {"name": "get_weather", "arguments": {"city": "Paris"}}\nDone.',
     [ok("get_weather", PARIS), "\nDone."]),
    ("m_v11", M, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', [ok("get_weather", PARIS)]),
    ("m_v11_two", M, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}',
     [ok("get_weather", PARIS), ok("get_time", {})]),
    ("m_v11_call_id", M, '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}', [ok("get_weather", PARIS)]),
    ("m_v11_tokens_dropped", M, '[TOOL_CALLS]get_weather{"city": "Paris"}', [ok("get_weather", PARIS)]),
    ("m_marker_in_string", M, '[TOOL_CALLS] [{"name": "note", "arguments": {"text": "[TOOL_CALLS] ] } [ARGS]"}}]',
     [ok("note", {"text": "[TOOL_CALLS] ] } [ARGS]"})]),
    ("m_unicode_nested", M, "[TOOL_CALLS]create_event[ARGS]" + json.dumps(dict(NESTED, title="Zürich ☔ \"x\"")),
     [ok("create_event", dict(NESTED, title="Zürich ☔ \"x\""))]),
    ("m_plain", M, "Bonjour ! [TOOL_CALL is not a marker", ["Bonjour ! [TOOL_CALL is not a marker"]),
    # malformed
    ("m_list_truncated", M, '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}', [bad("", "unterminated")]),
    ("m_list_bad_json", M, '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": Paris}}]', [bad("", "bad JSON")]),
    ("m_element_not_object", M, '[TOOL_CALLS] [{"name": "get_time", "arguments": {}}, "get_weather"]',
     [ok("get_time", {}), bad("", "not a JSON object but a string")]),
    ("m_element_missing_name", M, '[TOOL_CALLS] [{"arguments": {"city": "Paris"}}]', [bad("", "missing name")]),
    ("m_v11_args_not_object", M, '[TOOL_CALLS]get_weather[ARGS]"Paris"', [bad("get_weather", "not a JSON object")]),
    ("m_v11_args_truncated", M, '[TOOL_CALLS]get_weather[ARGS]{"city": "Par', [bad("get_weather", "unterminated")]),
    ("m_v11_args_bad_json", M, '[TOOL_CALLS]get_weather[ARGS]{"city": Paris}[TOOL_CALLS]get_time[ARGS]{}',
     [bad("get_weather", "bad JSON"), ok("get_time", {})]),
    ("m_v11_no_args", M, "[TOOL_CALLS]get_weather", [bad("get_weather", "unterminated")]),
    ("m_marker_then_prose", M, "[TOOL_CALLS] I cannot call tools.", [bad("I", "expected [ARGS]")]),
    ("m_marker_only", M, "[TOOL_CALLS]", [bad("", "nothing after it")]),
    # --- generic fallback ---
    ("g_call", G, '{"name": "get_weather", "arguments": {"city": "Paris"}}', [ok("get_weather", PARIS)]),
    ("g_parameters", G, ' {"name": "get_weather", "parameters": {"city": "Paris"}}\n', [ok("get_weather", PARIS)]),
    ("g_fenced", G, '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```', [ok("get_weather", PARIS)]),
    ("g_fenced_plain", G, '```\n{"name": "create_event", "arguments": ' + json.dumps(NESTED) + '}\n```\n',
     [ok("create_event", NESTED)]),
    ("g_plain", G, "Paris: sunny, 21 °C.", ["Paris: sunny, 21 °C."]),
    ("g_json_not_a_call", G, '{"city": "Paris"}', ['{"city": "Paris"}']),
    ("g_call_then_prose", G, '{"name": "get_weather", "arguments": {}} is what I would send.',
     ['{"name": "get_weather", "arguments": {}} is what I would send.']),
    ("g_prose_then_call", G, 'Calling: {"name": "get_weather", "arguments": {}}',
     ['Calling: {"name": "get_weather", "arguments": {}}']),
    ("g_hermes_tags_are_text", G, WEATHER, [WEATHER]),
    ("g_fence_other_language", G, "```js\nconsole.log(1)\n```", ["```js\nconsole.log(1)\n```"]),
    # malformed
    ("g_truncated", G, '```json\n{"name": "get_weather", "arguments": {"city": "Par', [bad("get_weather", "unterminated")]),
    ("g_missing_name", G, '{"arguments": {"city": "Paris"}}', [bad("", "missing name")]),
    ("g_args_not_object", G, '{"name": "get_weather", "arguments": 3}', [bad("get_weather", "number")]),
    ("g_bad_json", G, '{"name": "get_weather", "arguments": {city: "Paris"}}', [bad("get_weather", "bad JSON")]),
]


def stream(cls: type, chunks: list[str]) -> list[Any]:
    p = cls()
    out: list[Any] = []
    for c in chunks:
        out += p.feed(c)
    return merge(out + p.close())


def expected_events(spec: list[Any]) -> list[Any]:
    return [Text(s) if isinstance(s, str) else s for s in spec]


def check(events: list[Any], spec: list[Any]) -> None:
    assert len(events) == len(spec), events
    for e, s in zip(events, spec, strict=False):
        if isinstance(s, str):
            assert e == Text(s)
            continue
        kind, name, x = s
        assert isinstance(e, Call), e
        assert e.name == name, e
        if kind == "call":
            assert e.error is None, e
            assert e.arguments == json.dumps(x, ensure_ascii=False)
        else:
            assert e.error is not None and x in e.error, e
            assert e.arguments == ""


def chunkings(text: str, seed: int) -> list[list[str]]:
    """Every 2-way split, char by char, and random multi-way cuts (seeded, bounded)."""
    n = len(text)
    out = [[text[:i], text[i:]] for i in range(n + 1)]
    out.append(list(text))
    rng = random.Random(seed)
    for k in (2, 3, 5, 8, 13, 21):
        cuts = sorted(rng.sample(range(1, n), min(k, n - 1))) if n > 1 else []
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, n], strict=False)])
    for hi in (3, 6):  # token-sized deltas
        i, chunks = 0, []
        while i < n:
            step = rng.randint(1, hi)
            chunks.append(text[i:i + step])
            i += step
        out.append(chunks)
    return out


@pytest.mark.parametrize("name,cls,text,spec", CASES, ids=[c[0] for c in CASES])
def test_recorded_output(name: str, cls: type, text: str, spec: list[Any]) -> None:
    whole = parse_all(cls(), text)
    check(whole, spec)
    for call in whole:
        if isinstance(call, Call):
            assert call.raw and call.raw in text  # the exact text it came from
            if call.error is None:
                assert isinstance(json.loads(call.arguments), dict)
    for i, chunks in enumerate(chunkings(text, seed=zlib.crc32(name.encode()))):
        assert stream(cls, chunks) == whole, f"chunking {i}: {chunks!r}"


@pytest.mark.parametrize("name,cls,text,spec", CASES, ids=[c[0] for c in CASES])
def test_every_truncation_is_handled(name: str, cls: type, text: str, spec: list[Any]) -> None:
    """The output cut off at any point (max_tokens): no crash, nothing broken passed on as fine."""
    for i in range(len(text)):
        events = parse_all(cls(), text[:i])
        for e in events:
            if isinstance(e, Text):
                assert e.text in text
            else:
                if e.error is None:
                    assert isinstance(json.loads(e.arguments), dict)
                else:
                    assert e.arguments == ""
        assert stream(cls, [text[: i // 2], text[i // 2: i]]) == events


SOUP = ["<tool_call>", "</tool_call>", "<tool_", "<|python_tag|>", "<|py", "[TOOL_CALLS]", "[TOOL_", "[ARGS]", "[CALL_ID]",
        "{", "}", "[", "]", '"', "\\", '\\"', ":", ",", ";", " ", "\n", "```", "```json\n", '"name"', '"arguments"',
        '"parameters"', '"f"', "{}", "ab", "é", "🌧", "\\u00e9", "NaN", "1", "<", "`"]


@pytest.mark.parametrize("cls", [H, L, M, G])
def test_random_soup_of_markers_and_json_pieces(cls: type) -> None:
    """Seeded random outputs built from markers, partial markers and JSON punctuation: any chunking agrees."""
    rng = random.Random(14)
    for _ in range(60):
        text = "".join(rng.choice(SOUP) for _ in range(rng.randint(1, 25)))
        whole = parse_all(cls(), text)
        for e in whole:
            if isinstance(e, Call) and e.error is None:
                assert isinstance(json.loads(e.arguments), dict)
        cuts = [list(text)] + [[text[:i], text[i:]] for i in sorted(rng.sample(range(len(text) + 1), min(8, len(text) + 1)))]
        for chunks in cuts:
            assert stream(cls, chunks) == whole, (text, chunks)


def test_held_back_marker_prefix_is_released_when_it_cannot_be_one() -> None:
    p = HermesParser()
    assert p.feed("Hi <tool_") == [Text("Hi ")]
    assert p.feed("x") == [Text("<tool_x")]
    assert p.close() == []
    p = HermesParser()
    assert p.feed("Hi <") == [Text("Hi ")]
    assert p.feed("tool_call") == []
    assert p.feed(">\n") == []
    assert p.feed('{"name": "f", "arguments": {}}\n</tool_call') == []
    assert p.feed(">") == [Call("f", "{}", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')]
    p = Llama3JsonParser()
    assert p.feed("Sure <|python") == [Text("Sure ")]
    assert p.feed("!") == [Text("<|python!")]
    p = MistralParser()
    assert p.feed("Ok [TOOL_") == [Text("Ok ")]
    assert p.feed("CALLED]") == [Text("[TOOL_CALLED]")]
    assert parse_all(HermesParser(), "end <tool_call") == [Text("end <tool_call")]  # close releases a held prefix


def test_text_streams_as_soon_as_it_cannot_be_a_call() -> None:
    for cls in (HermesParser, Llama3JsonParser, MistralParser, GenericParser):
        p = cls()
        assert p.feed("Hello") == [Text("Hello")], cls
        assert p.feed(" world") == [Text(" world")], cls
    p = HermesParser()
    assert p.feed('{"na') == []  # may be Qwen-Coder's bare JSON call: held
    p = GenericParser()
    assert p.feed("{ ") == []
    assert p.feed("x") == [Text("{ x")]  # `{` then not `"`: not JSON, released
    p = HermesParser()
    assert p.feed("```") == []
    assert p.feed("py") == [Text("```py")]


def test_calls_come_out_as_soon_as_complete() -> None:
    p = HermesParser()
    assert p.feed(WEATHER) == [Call("get_weather", '{"city": "Paris"}', WEATHER)]
    assert p.feed("\n") == []  # whitespace after a call is held ...
    assert p.feed("More.") == [Text("\nMore.")]  # ... and given back before prose
    p = Llama3JsonParser()
    assert p.feed('{"name": "f", "parameters": {"a": {"b": 1}}') == []
    assert p.feed("}") == [Call("f", '{"a": {"b": 1}}', '{"name": "f", "parameters": {"a": {"b": 1}}}')]
    p = MistralParser()
    assert p.feed('[TOOL_CALLS]f[ARGS]{"a": 1}') == [Call("f", '{"a": 1}', '[TOOL_CALLS]f[ARGS]{"a": 1}')]
    p = GenericParser()  # only the whole reply can be a call: decided at the end
    assert p.feed('{"name": "f", "arguments": {}}') == []
    assert p.close() == [Call("f", "{}", '{"name": "f", "arguments": {}}')]


def test_parse_all_merges_text_and_a_parser_is_single_use() -> None:
    assert parse_all(HermesParser(), "a <b <c") == [Text("a <b <c")]
    p = MistralParser()
    p.close()
    with pytest.raises(RuntimeError):
        p.feed("x")


QWEN25_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
)
LLAMA31_TEMPLATE = (
    "{{- \"Given the following functions, please respond with a JSON for a function call with its proper arguments "
    "that best answers the given prompt.\\n\\n\" }}\n"
    "{{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}\n"
    "{%- if builtin_tools is defined and tool_call.name in builtin_tools %}\n"
    "    {{- \"<|python_tag|>\" + tool_call.name + \".call(\" }}\n"
)
LLAMA32_TEMPLATE = (
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n"
    "{{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}\n"
)
GEMMA_TEMPLATE = "{{ bos_token }}{%- for m in messages -%}{{ '<start_of_turn>' + m['role'] + '\\n' }}{%- endfor -%}"
CHATML_TEMPLATE = ("{%- for m in messages -%}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
                   "{%- endfor -%}")
MISTRAL_TEMPLATE = (
    "{%- if tools is not none and (message == user_messages[-1]) %}\n"
    "    {{- \"[AVAILABLE_TOOLS] [\" }}\n"
    "{%- elif message.tool_calls is defined and message.tool_calls is not none %}\n"
    "    {{- \"[TOOL_CALLS] [\" }}\n"
)


def test_parser_for_picks_the_family() -> None:
    assert isinstance(parser_for(QWEN25_TEMPLATE), HermesParser)
    assert isinstance(parser_for(LLAMA31_TEMPLATE), Llama3JsonParser)
    assert isinstance(parser_for(LLAMA32_TEMPLATE), Llama3JsonParser)
    assert isinstance(parser_for(MISTRAL_TEMPLATE), MistralParser)
    assert isinstance(parser_for(GEMMA_TEMPLATE, "gemma3"), GenericParser)  # templates without a tool format
    assert isinstance(parser_for(None), GenericParser)
    assert isinstance(parser_for(CHATML_TEMPLATE, "qwen2"), HermesParser)  # no template marker: the architecture
    assert isinstance(parser_for(CHATML_TEMPLATE, "llama", {"<tool_call>", "</tool_call>"}.__contains__), HermesParser)
    assert isinstance(parser_for(None, "llama", {"[TOOL_CALLS]", "[ARGS]"}.__contains__), MistralParser)
    assert isinstance(parser_for(None, "llama", {"<|python_tag|>"}.__contains__), Llama3JsonParser)
    assert isinstance(parser_for(None, "llama", set().__contains__), GenericParser)
    assert family_for(QWEN25_TEMPLATE, "llama", {"[TOOL_CALLS]"}.__contains__) is HermesParser  # the template wins
    a, b = parser_for(QWEN25_TEMPLATE), parser_for(QWEN25_TEMPLATE)
    assert a is not b  # a fresh parser per response
