"""The scripted fake upstream speaks the three wires well enough for the official
SDKs' parsers and stream helpers, tool calls included (no model, fast)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from support.fake_upstream import (
    FakeUpstream,
    Offer,
    allowed_and_destructive,
    offer_of,
    shell_call,
)

BASH = {"name": "Bash", "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
READ = {"name": "Read", "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}
EXEC = {"type": "function", "name": "exec_command", "description": "Run a command", "strict": False,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/s"}}
CHAT_BASH = {"type": "function", "function": {"name": "bash", "description": "Run a command",
             "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}

SCRIPT = allowed_and_destructive("echo ok > allowed.txt", "rm -rf /")
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def up() -> Iterator[FakeUpstream]:
    with FakeUpstream(SCRIPT) as u:
        yield u


def ant(up: FakeUpstream) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=up.url, api_key="sk-ant-test", max_retries=0)


def oai(up: FakeUpstream) -> openai.OpenAI:
    return openai.OpenAI(base_url=up.url + "/v1", api_key="sk-test", max_retries=0)


# -- Anthropic Messages


def test_anthropic_non_streaming_tool_calls(up: FakeUpstream) -> None:
    msg = ant(up).messages.create(model="claude-x", max_tokens=100, messages=HI, tools=[BASH, READ])
    assert msg.stop_reason == "tool_use" and msg.model == "claude-x"
    assert [b.type for b in msg.content] == ["text", "tool_use", "tool_use"]
    assert [(b.name, b.input) for b in msg.content[1:]] == [
        ("Bash", {"command": "echo ok > allowed.txt"}), ("Bash", {"command": "rm -rf /"})]
    rec = up.requests[-1]
    assert rec.path == "/v1/messages" and rec.headers["authorization"] == "Bearer sk-ant-test"  # SDK 2.x
    assert rec.offer == Offer("anthropic", ["Bash", "Read"], False, rec.body)


def test_anthropic_stream_helper_reassembles_split_tool_input(up: FakeUpstream) -> None:
    with ant(up).messages.stream(model="claude-x", max_tokens=100, messages=HI, tools=[BASH]) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "message_delta" in kinds
    pieces = [e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    assert len([p for p in pieces if p]) >= 6  # the arguments come in small pieces
    assert final.stop_reason == "tool_use" and final.usage.output_tokens > 0
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [
        ("Bash", {"command": "echo ok > allowed.txt"}), ("Bash", {"command": "rm -rf /"})]
    assert stream.current_message_snapshot.content[0].text == "Working on it."


@pytest.mark.slow
def test_anthropic_followup_and_beta_route(up: FakeUpstream) -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash",
                                           "input": {"command": "echo ok"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]},
    ]
    # Claude Code posts to /v1/messages?beta=true (the SDK's beta namespace no longer adds it)
    with ant(up).beta.messages.stream(model="claude-x", max_tokens=100, messages=messages, tools=[BASH],
                                      extra_query={"beta": "true"}) as s:
        final = s.get_final_message()
    assert final.stop_reason == "end_turn" and [b.type for b in final.content] == ["text"]
    rec = up.requests[-1]
    assert rec.path == "/v1/messages" and rec.query == "beta=true" and rec.offer and rec.offer.followup
    assert up.followups() == [rec]
    assert ant(up).messages.count_tokens(model="claude-x", messages=HI).input_tokens > 0


# -- OpenAI Chat Completions


def test_chat_non_streaming_tool_calls(up: FakeUpstream) -> None:
    c = oai(up).chat.completions.create(model="gpt-x", messages=HI, tools=[CHAT_BASH])
    choice = c.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Working on it."
    assert [(t.function.name, json.loads(t.function.arguments)) for t in choice.message.tool_calls or []] == [
        ("bash", {"command": "echo ok > allowed.txt"}), ("bash", {"command": "rm -rf /"})]
    assert c.usage and c.usage.total_tokens > 0
    assert up.requests[-1].headers["authorization"] == "Bearer sk-test"


def test_chat_streaming_tool_call_deltas(up: FakeUpstream) -> None:
    chunks = list(oai(up).chat.completions.create(model="gpt-x", messages=HI, tools=[CHAT_BASH], stream=True,
                                                  stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage and chunks[-1].usage.completion_tokens > 0
    calls: dict[int, dict[str, str]] = {}
    for ch in chunks:
        for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
            slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            slot["id"] += tc.id or ""
            slot["name"] += (tc.function and tc.function.name) or ""
            slot["arguments"] += (tc.function and tc.function.arguments) or ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("bash", {"command": "echo ok > allowed.txt"}), ("bash", {"command": "rm -rf /"})]
    assert all(c["id"].startswith("call_") for c in calls.values())
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"


def test_chat_stream_helper_and_followup(up: FakeUpstream) -> None:
    with oai(up).chat.completions.stream(model="gpt-x", messages=HI, tools=[CHAT_BASH]) as s:
        final = s.get_final_completion()
    calls = final.choices[0].message.tool_calls or []
    assert [json.loads(t.function.arguments)["command"] for t in calls] == ["echo ok > allowed.txt", "rm -rf /"]
    messages = [*HI, {"role": "assistant", "content": None, "tool_calls": [{"id": calls[0].id, "type": "function",
                "function": {"name": "bash", "arguments": calls[0].function.arguments}}]},
                {"role": "tool", "tool_call_id": calls[0].id, "content": "ok"}]
    again = oai(up).chat.completions.create(model="gpt-x", messages=messages, tools=[CHAT_BASH])
    assert again.choices[0].finish_reason == "stop" and not again.choices[0].message.tool_calls
    assert up.requests[-1].offer and up.requests[-1].offer.followup


# -- OpenAI Responses


def test_responses_non_streaming(up: FakeUpstream) -> None:
    r = oai(up).responses.create(model="gpt-x", input="hi", tools=[EXEC])
    assert r.status == "completed" and r.output_text == "Working on it."
    calls = [i for i in r.output if i.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("exec_command", {"cmd": "echo ok > allowed.txt"}), ("exec_command", {"cmd": "rm -rf /"})]


def test_responses_stream_helper(up: FakeUpstream) -> None:
    with oai(up).responses.stream(model="gpt-x", input="hi", tools=[EXEC, PATCH]) as s:
        events = list(s)
        final = s.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    for k in ("response.output_item.added", "response.content_part.added", "response.output_text.delta",
              "response.output_text.done", "response.content_part.done", "response.function_call_arguments.done",
              "response.output_item.done"):
        assert k in kinds
    assert kinds.count("response.function_call_arguments.delta") >= 6
    assert [e.sequence_number for e in events] == list(range(len(events)))
    calls = [i for i in final.output if i.type == "function_call"]
    assert [json.loads(c.arguments) for c in calls] == [{"cmd": "echo ok > allowed.txt"}, {"cmd": "rm -rf /"}]
    assert final.usage and final.usage.total_tokens > 0
    assert up.requests[-1].offer and up.requests[-1].offer.tools == ["exec_command", "apply_patch"]


def test_responses_custom_tool_and_followup() -> None:
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch\n"
    with FakeUpstream(lambda o: [] if o.followup else [("apply_patch", {"input": patch})]) as up:
        with oai(up).responses.stream(model="gpt-x", input="hi", tools=[EXEC, PATCH]) as s:
            final = s.get_final_response()
        [call] = [i for i in final.output if i.type == "custom_tool_call"]
        assert call.name == "apply_patch" and call.input == patch
        follow = [{"type": "custom_tool_call", "call_id": call.call_id, "name": "apply_patch", "input": patch},
                  {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done"}]
        r = oai(up).responses.create(model="gpt-x", input=follow, tools=[EXEC, PATCH])
        assert [i.type for i in r.output] == ["message"]
        assert up.requests[-1].offer and up.requests[-1].offer.followup


# -- errors, drops, routes


def test_fail_in_each_wires_error_shape() -> None:
    with FakeUpstream(fail=529) as up:
        with pytest.raises(anthropic.APIStatusError) as ae:
            ant(up).messages.create(model="c", max_tokens=10, messages=HI)
        assert ae.value.status_code == 529 and ae.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
        with pytest.raises(openai.APIStatusError) as oe:
            oai(up).chat.completions.create(model="g", messages=HI, stream=True)
        assert oe.value.status_code == 529 and set(oe.value.body) >= {"message", "type", "code"}  # type: ignore[arg-type]
    with FakeUpstream(fail=429) as up, pytest.raises(openai.RateLimitError):
        oai(up).responses.create(model="g", input="hi")


def test_drop_mid_stream() -> None:
    with FakeUpstream(SCRIPT, drop_mid_stream=True) as up:
        # the SDK's transport (httpx2) raises its RemoteProtocolError: incomplete chunked read
        with (
            pytest.raises(Exception, match="incomplete|closed|peer"),
            ant(up).messages.stream(model="c", max_tokens=10, messages=HI, tools=[BASH]) as s,
        ):
            s.get_final_message()
        body = {"model": "g", "messages": HI, "stream": True}
        with httpx.stream("POST", up.url + "/v1/chat/completions", json=body) as r, pytest.raises(httpx.HTTPError):
            r.read()


def test_models_and_404(up: FakeUpstream) -> None:
    assert [m.id for m in oai(up).models.list()] == ["fake-model"]
    r = httpx.post(up.url + "/v1/embeddings", json={})
    assert r.status_code == 404 and "error" in r.json()
    assert httpx.post(up.url + "/v1/messages/batches", json={}).json()["type"] == "error"
    assert up.calls() == []  # no model request among those


# -- the script helpers


def test_shell_call_follows_the_offered_tool() -> None:
    def offer(wire: str, tools: list[dict]) -> Offer:
        return offer_of(wire, {"tools": tools})

    assert shell_call(offer("anthropic", [READ, BASH]), "ls") == ("Bash", {"command": "ls"})
    assert shell_call(offer("responses", [PATCH, EXEC]), "ls") == ("exec_command", {"cmd": "ls"})
    shell = {"type": "function", "name": "shell", "parameters": {"type": "object",
             "properties": {"command": {"type": "array", "items": {"type": "string"}}}}}
    assert shell_call(offer("responses", [shell]), "ls") == ("shell", {"command": ["bash", "-lc", "ls"]})
    assert shell_call(offer("chat", [CHAT_BASH]), "ls") == ("bash", {"command": "ls"})
    run = {"type": "function", "function": {"name": "run_command", "parameters": {"type": "object"}}}
    assert shell_call(offer("chat", [run]), "ls") == ("run_command", {"command": "ls"})
    with pytest.raises(LookupError):
        shell_call(offer("anthropic", [READ]), "ls")


def test_allowed_and_destructive_only_on_a_first_turn_with_tools() -> None:
    first = offer_of("anthropic", {"tools": [BASH], "messages": HI})
    assert SCRIPT(first) == [("Bash", {"command": "echo ok > allowed.txt"}), ("Bash", {"command": "rm -rf /"})]
    assert SCRIPT(offer_of("anthropic", {"messages": HI})) == []
    tool_turn = {"tools": [EXEC], "input": [{"type": "function_call_output", "call_id": "c", "output": ""}]}
    assert SCRIPT(offer_of("responses", tool_turn)) == []
