"""The Anthropic Messages wire of `fak serve`, driven with the official `anthropic` SDK on the synthetic
checkpoint: the event sequence, stream == non-stream, stop reasons, usage, count_tokens, tool_result
turns, and errors in Anthropic's shape."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from support.serve_helpers import Server

pytestmark = pytest.mark.serve
MODEL = "synthetic"
GREEDY = {"temperature": 0}  # the current API has no temperature; fak still honours the old field


@pytest.fixture(scope="module")
def server():  # type: ignore[no-untyped-def]
    s = Server("--gguf", "synthetic")
    yield s
    assert s.stop() == 0


def _client(s: Server, key: str = "none") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=s.url, api_key=key, max_retries=0)


@pytest.mark.slow
def test_stream_equals_non_stream_with_the_real_event_sequence(server: Server) -> None:
    c = _client(server)
    kw = dict(model=MODEL, max_tokens=12, extra_body={"temperature": 0}, system="Be brief.",
              messages=[{"role": "user", "content": [{"type": "text", "text": "hi there"}]}])
    whole = c.messages.create(**kw)  # type: ignore[arg-type]
    assert whole.type == "message" and whole.role == "assistant" and whole.stop_reason == "max_tokens"
    assert [b.type for b in whole.content] == ["text"] and whole.usage.output_tokens == 12
    counted = c.messages.count_tokens(model=MODEL, system="Be brief.", messages=kw["messages"])  # type: ignore[arg-type]
    assert whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0) == counted.input_tokens
    kinds = []
    with c.messages.stream(**kw) as stream:  # type: ignore[arg-type]
        for ev in stream:
            kinds.append(ev.type)
        final = stream.get_final_message()
    assert final.content[0].text == whole.content[0].text and final.stop_reason == "max_tokens"
    raw = [k for k in kinds if k not in ("text",)]  # the SDK adds "text" helper events
    assert raw[0] == "message_start" and raw[1] == "content_block_start" and raw[-1] == "message_stop"
    assert raw[-2] == "message_delta" and raw[-3] == "content_block_stop"
    assert set(raw[2:-3]) == {"content_block_delta"}


def test_stop_sequences_and_prefix_cache_usage(server: Server) -> None:
    c = _client(server)
    msgs = [{"role": "user", "content": "tell me something long"}]
    full = c.messages.create(model=MODEL, max_tokens=12, messages=msgs, extra_body=GREEDY).content[0].text  # type: ignore[arg-type]
    stop = full[2:4]
    cut = c.messages.create(model=MODEL, max_tokens=12, messages=msgs, stop_sequences=["zzz", stop],
                           extra_body=GREEDY)  # type: ignore[arg-type]
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == full[: full.index(stop)]
    again = c.messages.create(model=MODEL, max_tokens=2, messages=msgs, extra_body=GREEDY)  # type: ignore[arg-type]
    assert (again.usage.cache_read_input_tokens or 0) > 0  # the same prompt: its prefix is reused


def test_tool_use_and_tool_result_turns_render(server: Server) -> None:
    c = _client(server)
    tools = [{"name": "get_weather", "description": "Weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    msgs = [{"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Let me check."},
                                              {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                               "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C, sunny"}]}]
    with_result = c.messages.count_tokens(model=MODEL, messages=msgs, tools=tools).input_tokens  # type: ignore[arg-type]
    without = c.messages.count_tokens(model=MODEL, messages=msgs[:1], tools=tools).input_tokens  # type: ignore[arg-type]
    assert with_result > without
    r = c.messages.create(model=MODEL, max_tokens=4, messages=msgs, tools=tools, extra_body=GREEDY)  # type: ignore[arg-type]
    assert r.stop_reason in ("max_tokens", "end_turn", "tool_use")


def test_errors_in_anthropic_shape(server: Server) -> None:
    c = _client(server)
    with pytest.raises(anthropic.NotFoundError) as e:
        c.messages.create(model="claude-nope", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error"
    for body, word in (({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
                       ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                         "temperature": 1.5}, "temperature"),
                       ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [
                           {"type": "image", "source": {}}]}]}, "image"),
                       ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                         "thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
                       ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                         "container": "c1"}, "container"),
                       ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                         "tools": [{"name": "f", "input_schema": {"type": "object"}}] * 2}, "used twice"),
                       ({"model": MODEL, "max_tokens": 10**7, "messages": [{"role": "user", "content": "x"}]},
                        "context length")):
        r = httpx.post(server.url + "/v1/messages", json=body, timeout=10)
        assert r.status_code == 400, (body, r.text)
        err = r.json()
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error" and word in err["error"]["message"]


@pytest.mark.slow
def test_auth_by_x_api_key_in_anthropic_shape() -> None:
    s = Server("--gguf", "synthetic", "--api-key", "k3y")
    try:
        with pytest.raises(anthropic.AuthenticationError) as e:
            _client(s, "wrong").messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "x"}])
        assert e.value.body["error"]["type"] == "authentication_error"
        ok = _client(s, "k3y").messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "x"}])
        assert ok.usage.output_tokens == 2
    finally:
        assert s.stop() == 0
