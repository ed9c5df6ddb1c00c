"""The OpenAI Responses wire of `fak serve`, driven with the official `openai` SDK on the synthetic
checkpoint: typed stream events, stream == non-stream, usage, incomplete on max_output_tokens,
function_call / function_call_output items, refused stateful fields."""

from __future__ import annotations

import httpx
import openai
import pytest

from support.serve_helpers import Server

pytestmark = pytest.mark.serve
MODEL = "synthetic"


@pytest.fixture(scope="module")
def server():  # type: ignore[no-untyped-def]
    s = Server("--gguf", "synthetic")
    yield s
    assert s.stop() == 0


@pytest.mark.slow
def test_stream_equals_non_stream_with_typed_events(server: Server) -> None:
    c = server.client()
    kw = dict(model=MODEL, input="hello there", instructions="Be brief.", max_output_tokens=10, temperature=0)
    whole = c.responses.create(**kw)  # type: ignore[call-overload]
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.output[0].type == "message" and whole.usage.output_tokens == 10
    text = whole.output_text
    events = list(c.responses.create(stream=True, **kw))  # type: ignore[call-overload]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == text
    assert events[-1].response.output_text == text and events[-1].response.usage.output_tokens == 10


def test_input_items_with_function_calls_render(server: Server) -> None:
    c = server.client()
    tools = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    items = [{"role": "user", "content": [{"type": "input_text", "text": "weather in Paris?"}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "18C"}]
    r = c.responses.create(model=MODEL, input=items, tools=tools, max_output_tokens=4, temperature=0)  # type: ignore[arg-type]
    assert r.status in ("completed", "incomplete") and r.usage.input_tokens > 0
    assert c.responses.create(model=MODEL, input=items[:1], tools=tools, max_output_tokens=4,  # type: ignore[arg-type]
                              temperature=0).usage.input_tokens < r.usage.input_tokens


def test_refused_fields_are_400s(server: Server) -> None:
    for extra, param in (({"previous_response_id": "resp_1"}, "previous_response_id"),
                         ({"text": {"format": {"type": "xml"}}}, "text"),
                         ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}},
                          "text"),
                         ({"bogus": 1}, "bogus"),
                         ({"tools": [{"type": "function", "name": "f"}] * 2}, "tools"),
                         ({"max_output_tokens": 10**7}, "max_output_tokens"),
                         ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]},
                          "input")):
        body = {"model": MODEL, "input": "x"} | extra
        r = httpx.post(server.url + "/v1/responses", json=body, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (extra, r.text)
    with pytest.raises(openai.NotFoundError):
        server.client().responses.create(model="gpt-5", input="x")
