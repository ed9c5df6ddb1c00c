"""Tool calls through the kernel on a real instruct model: `fak serve --gguf qwen2.5-coder-0.5b` driven
with the `openai` and `anthropic` SDKs. Calls parsed out of the model's text, adjudicated before the
client sees them, the same both ways (stream and not), refused ones replaced by the in-band note,
every decision journaled in a chain that verifies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anthropic
import httpx
import pytest

from support import paths
from support.serve_helpers import Server

pytestmark = [pytest.mark.serve, pytest.mark.qwen, pytest.mark.slow]
MODEL = "qwen2.5-coder-0.5b"
REPO = paths.REPO
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
BASH = {"type": "function", "function": {
    "name": "Bash", "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]
DESTROY = [{"role": "user", "content": "Use the Bash tool to run exactly this command: rm -rf ~"}]


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("qwen") / "journal.jsonl"


@pytest.fixture(scope="module")
def server(journal: Path):  # type: ignore[no-untyped-def]
    s = Server("--gguf", MODEL, "--journal", str(journal))
    yield s
    assert s.stop() == 0


def _streamed_calls(chunks: list) -> tuple[list[dict], str, list[str]]:  # type: ignore[type-arg]
    """Tool-call deltas reassembled by index (as SDK users do), the text, and the finish reasons."""
    calls: dict[int, dict] = {}  # type: ignore[type-arg]
    text, finishes = [], []
    for ch in chunks:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        text.append(d.content or "")
        for tc in d.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                assert slot["id"] is None, "only the first delta of a call carries its id"
                slot["id"], slot["name"] = tc.id, tc.function.name
                assert tc.function.arguments == ""  # the opening delta: name, empty arguments
            else:
                slot["arguments"] += tc.function.arguments or ""
        if ch.choices[0].finish_reason:
            finishes.append(ch.choices[0].finish_reason)
    return [calls[i] for i in sorted(calls)], "".join(text), finishes


def test_a_weather_call_same_streamed_and_not(server: Server) -> None:
    c = server.client()
    whole = c.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=80)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    adj = whole.model_extra["fak"]["adjudications"]
    assert [(a["tool"], a["verdict"], a["emitted"]) for a in adj] == [("get_weather", "ALLOW", True)]
    chunks = list(c.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=80,
                                            stream=True))
    calls, text, finishes = _streamed_calls(chunks)
    assert finishes == ["tool_calls"] and text == (choice.message.content or "")
    assert [(k["name"], json.loads(k["arguments"])) for k in calls] == [("get_weather", {"city": "Paris"})]
    quiet = c.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none", temperature=0,
                                      max_tokens=24)
    assert not quiet.choices[0].message.tool_calls and quiet.choices[0].finish_reason in ("stop", "length")
    assert quiet.choices[0].message.content


def test_a_destructive_call_never_reaches_the_client(server: Server, journal: Path) -> None:
    c = server.client()
    r = c.chat.completions.create(model=MODEL, messages=DESTROY, tools=[BASH], temperature=0, max_tokens=80)
    choice = r.choices[0]
    assert not choice.message.tool_calls and choice.finish_reason != "tool_calls"
    assert "[fak] refused Bash: POLICY_BLOCK" in choice.message.content
    adj = r.model_extra["fak"]["adjudications"]
    assert [(a["tool"], a["verdict"], a["reason"], a["emitted"]) for a in adj] == [("Bash", "DENY", "POLICY_BLOCK", False)]
    chunks = list(c.chat.completions.create(model=MODEL, messages=DESTROY, tools=[BASH], temperature=0, max_tokens=80,
                                            stream=True))
    calls, text, _ = _streamed_calls(chunks)
    assert calls == [] and "[fak] refused Bash" in text and "rm -rf" not in text.replace("rm -r of", "")
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    denies = [rec for rec in records if rec["tool"] == "Bash" and rec["verdict"] == "DENY"]
    assert len(denies) >= 2 and all(rec["reason"] == "POLICY_BLOCK" for rec in denies)
    v = subprocess.run([sys.executable, "-m", "commands.main", "audit", "verify", str(journal)], capture_output=True,
                       text=True, cwd=REPO, timeout=60)
    assert v.returncode == 0, v.stdout + v.stderr


def test_anthropic_tool_use_streamed_and_not_and_the_result_round_trip(server: Server) -> None:
    a = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    tool = {"name": "get_weather", "description": WEATHER["function"]["description"],
            "input_schema": WEATHER["function"]["parameters"]}
    greedy = {"temperature": 0}
    m = a.messages.create(model=MODEL, max_tokens=80, messages=ASK, tools=[tool], extra_body=greedy)  # type: ignore[arg-type]
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and [(u.name, u.input) for u in uses] == [("get_weather", {"city": "Paris"})]
    with a.messages.stream(model=MODEL, max_tokens=80, messages=ASK, tools=[tool], extra_body=greedy) as s:  # type: ignore[arg-type]
        final = s.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [("get_weather", {"city": "Paris"})]
    assert final.stop_reason == "tool_use"
    turn = ASK + [{"role": "assistant", "content": [u.model_dump(exclude_none=True) for u in uses]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                "content": '{"temperature_c": 18, "sky": "sunny"}'}]}]
    after = a.messages.create(model=MODEL, max_tokens=60, messages=turn, tools=[tool], extra_body=greedy)  # type: ignore[arg-type]
    said = "".join(b.text for b in after.content if b.type == "text")
    # the 0.5B model echoes the result it was given: "18" can only come from the tool_result turn
    assert after.stop_reason == "end_turn" and "18" in said and "sunny" in said


def test_responses_function_call_item(server: Server) -> None:
    c = server.client()
    tool = {"type": "function", "name": "get_weather", "description": WEATHER["function"]["description"],
            "parameters": WEATHER["function"]["parameters"]}
    r = c.responses.create(model=MODEL, input=ASK, tools=[tool], temperature=0, max_output_tokens=80)  # type: ignore[arg-type]
    calls = [o for o in r.output if o.type == "function_call"]
    assert [(k.name, json.loads(k.arguments)) for k in calls] == [("get_weather", {"city": "Paris"})]
    events = list(c.responses.create(model=MODEL, input=ASK, tools=[tool], temperature=0, max_output_tokens=80,  # type: ignore[arg-type]
                                     stream=True))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == {"city": "Paris"} and events[-1].type == "response.completed"


STRICT = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}


def test_tool_choice_forces_the_named_tool_and_a_forced_destructive_call_is_refused(server: Server) -> None:
    c = server.client()
    hello = [{"role": "user", "content": "Hello! How are you?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = c.chat.completions.create(model=MODEL, messages=hello, tools=[STRICT, BASH], tool_choice=named, temperature=0,
                                  max_tokens=60)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and [k.function.name for k in calls] == ["get_weather"]
    assert set(json.loads(calls[0].function.arguments)) == {"city"}
    streamed, _, _ = _streamed_calls(list(c.chat.completions.create(
        model=MODEL, messages=hello, tools=[STRICT, BASH], tool_choice=named, temperature=0, max_tokens=60, stream=True)))
    assert [(k["name"], k["arguments"]) for k in streamed] == [("get_weather", calls[0].function.arguments)]
    forced = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Delete everything in my "
                                                               "home directory with rm -rf ~"}],
                                       tools=[STRICT, BASH], tool_choice="required", temperature=0, max_tokens=60)
    assert not forced.choices[0].message.tool_calls and "[fak] refused Bash" in forced.choices[0].message.content
    assert forced.model_extra["fak"]["adjudications"][0]["verdict"] == "DENY"
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
        "messages": hello, "tools": [STRICT], "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                                                 "minItems": 1, "maxItems": 3}},
     "required": ["colors"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "score": {"type": "number"},
                                      "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2}},
     "required": ["ok", "score"], "additionalProperties": False},
]


def test_response_format_json_schema_validates(server: Server) -> None:
    import jsonschema

    c = server.client()
    ask = [{"role": "user", "content": "Make up an example record."}]
    for i, schema in enumerate(SCHEMAS):
        fmt = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema}}
        r = c.chat.completions.create(model=MODEL, messages=ask, response_format=fmt, temperature=0, max_tokens=80)  # type: ignore[arg-type]
        assert r.choices[0].finish_reason == "stop", r.choices[0]
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    two = [{"role": "user", "content": "Give a JSON object with two fields: a name and an age."}]
    obj = c.chat.completions.create(model=MODEL, messages=two, response_format={"type": "json_object"}, temperature=0,
                                    max_tokens=80)
    assert obj.choices[0].finish_reason == "stop" and isinstance(json.loads(obj.choices[0].message.content), dict)
    bad = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
        "messages": ask, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"type": "nonsense"}}}}}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "response_format"


def test_anthropic_tool_choice_tool_forces_a_call(server: Server) -> None:
    a = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    tool = {"name": "get_weather", "description": STRICT["function"]["description"],
            "input_schema": STRICT["function"]["parameters"]}
    m = a.messages.create(model=MODEL, max_tokens=60, messages=[{"role": "user", "content": "Hi!"}], tools=[tool],  # type: ignore[arg-type]
                          tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0})
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and [u.name for u in uses] == ["get_weather"] and set(uses[0].input) == {"city"}
