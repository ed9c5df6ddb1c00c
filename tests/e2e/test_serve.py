"""`fak serve` driven with the official `openai` SDK, on the synthetic checkpoint (fast, byte vocabulary):
framing, stream == non-stream, usage, n, seed, stop strings, errors, auth, CORS, tokenize."""

from __future__ import annotations

import json
import time

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
    assert s.stop() == 0  # SIGTERM: drained and exited cleanly


@pytest.mark.slow
def test_completion_stream_equals_non_stream_and_framing(server: Server) -> None:
    c = server.client()
    whole = c.completions.create(model=MODEL, prompt="hello", max_tokens=12, temperature=0)
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 12
    assert whole.usage.prompt_tokens == 5 and whole.usage.total_tokens == 17
    chunks = list(c.completions.create(model=MODEL, prompt="hello", max_tokens=12, temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == whole.choices[0].text
    assert sum(ch.choices[0].finish_reason is not None for ch in chunks if ch.choices) == 1
    assert len({ch.id for ch in chunks}) == 1 and all(ch.usage is None for ch in chunks)  # usage not asked


def test_chat_stream_role_first_one_finish_usage_last(server: Server) -> None:
    c = server.client()
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    whole = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, temperature=0)
    chunks = list(c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == whole.choices[0].message.content
    assert sum(1 for ch in chunks if ch.choices and ch.choices[0].finish_reason) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 10
    assert all(ch.usage is None for ch in chunks[:-1])
    assert len({ch.id for ch in chunks}) == 1


def test_raw_sse_ends_with_done(server: Server) -> None:
    with httpx.stream("POST", server.url + "/v1/completions", json={"prompt": "ab", "max_tokens": 3, "stream": True},
                      timeout=30) as r:
        body = "".join(r.iter_text())
    events = [e for e in body.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    assert [json.loads(e[6:])["object"] for e in events[:-1]] == ["text_completion"] * (len(events) - 1)


def test_n_seed_and_stop(server: Server) -> None:
    c = server.client()
    two = c.completions.create(model=MODEL, prompt="xy", max_tokens=8, temperature=0, n=2)
    assert [ch.index for ch in two.choices] == [0, 1] and two.choices[0].text == two.choices[1].text
    assert two.usage.completion_tokens == 16
    kw = dict(model=MODEL, prompt="seed", max_tokens=16, temperature=1.3, seed=7)
    a, b = c.completions.create(**kw), c.completions.create(**kw)  # type: ignore[call-overload]
    assert a.choices[0].text == b.choices[0].text
    neg = dict(kw, seed=-3694502861)  # any integer is a seed (schemathesis found the 500 a negative one gave)
    assert c.completions.create(**neg).choices[0].text == c.completions.create(**neg).choices[0].text  # type: ignore[call-overload]
    full = c.completions.create(model=MODEL, prompt="hello", max_tokens=12, temperature=0).choices[0].text
    stop = full[3:5]
    cut = c.completions.create(model=MODEL, prompt="hello", max_tokens=12, temperature=0, stop=[stop])
    assert cut.choices[0].text == full[: full.index(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = c.completions.create(model=MODEL, prompt="hello", max_tokens=12, temperature=0, stop=stop, stream=True)
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == cut.choices[0].text


def test_errors_are_openai_shaped_400s(server: Server) -> None:
    c = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt="x", max_tokens=10**7)
    err = e.value.body
    assert err["code"] == "context_length_exceeded" and "10000000" in err["message"] and err["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        c.completions.create(model=MODEL, prompt="x", max_tokens=2, presence_penalty=3.0)  # outside [-2, 2]
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        c.completions.create(model=MODEL, prompt="x", max_tokens=2, logit_bias={"999": 5})
    with pytest.raises(openai.NotFoundError, match="model_not_found|not served"):
        c.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    for body, field in (({"prompt": "x", "bogus": 1}, "bogus"), ({"prompt": "x", "max_tokens": "ten"}, "max_tokens"),
                        ({"prompt": "x", "temperature": 9}, "temperature"), ({"max_tokens": 3}, "prompt"),
                        ({"prompt": [1, 99999]}, "prompt")):
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=10)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == field and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(server.url + "/v1/chat/completions", content=b"{not json", timeout=10,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": []}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert httpx.get(server.url + "/v1/nope", timeout=10).status_code == 404


def test_models_health_tokenize_metrics(server: Server) -> None:
    models = httpx.get(server.url + "/v1/models", timeout=10).json()
    assert models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] > 0
    assert httpx.get(server.url + "/health", timeout=10).json()["status"] == "ok"
    tok = httpx.post(server.url + "/tokenize", json={"prompt": "héllo", "with_pieces": True}, timeout=10).json()
    assert tok["tokens"] == list("héllo".encode()) and tok["count"] == 6 and len(tok["pieces"]) == 6
    back = httpx.post(server.url + "/detokenize", json={"tokens": tok["tokens"]}, timeout=10).json()
    assert back["prompt"] == "héllo"
    assert httpx.post(server.url + "/detokenize", json={"tokens": [300]}, timeout=10).status_code == 400
    assert server.metric("fak_request_success_total") >= 1 and server.metric("fak_num_requests_running") == 0
    assert server.metric("fak_sched_admitted_total") >= 1


@pytest.mark.slow
def test_api_key_and_cors() -> None:
    s = Server("--gguf", "synthetic", "--api-key", "s3cret", "--cors-origin", "http://app.example")
    try:
        with pytest.raises(openai.AuthenticationError) as e:
            s.client(api_key="wrong").completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert e.value.body["code"] == "invalid_api_key" and e.value.body["type"] == "authentication_error"
        assert s.client(api_key="s3cret").completions.create(model=MODEL, prompt="x", max_tokens=2).choices
        ok = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2},
                        headers={"X-Api-Key": "s3cret"}, timeout=10)
        assert ok.status_code == 200
        assert httpx.get(s.url + "/health", timeout=10).status_code == 200  # public
        assert httpx.get(s.url + "/v1/models", timeout=10).status_code == 200  # public
        assert httpx.get(s.url + "/metrics", timeout=10).status_code == 401
        pre = httpx.options(s.url + "/v1/chat/completions", timeout=10, headers={
            "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://app.example"
    finally:
        assert s.stop() == 0


@pytest.mark.slow
def test_bad_model_and_flags_are_one_line() -> None:
    import subprocess
    import sys

    for args in (["--gguf", "/no/such.gguf"], ["--port", "70000"], ["--preempt", "drop"]):
        r = subprocess.run([sys.executable, "-m", "commands.main", "serve", *args], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert r.stderr.startswith("fak: error: ")


def test_vllm_named_metrics_move(server: Server) -> None:
    c = server.client()
    before = server.metric("fak_request_generation_tokens_count")
    c.completions.create(model=MODEL, prompt="metrics", max_tokens=6, temperature=0)
    assert server.metric("fak_request_generation_tokens_count") == before + 1
    text = httpx.get(server.url + "/metrics", timeout=10).text
    for name in ("fak_inter_token_latency_seconds_count", "fak_request_queue_time_seconds_count",
                 "fak_time_to_first_token_seconds_count", "fak_e2e_request_latency_seconds_count",
                 "fak_num_preemptions_total", "fak_prefix_cache_queries_total", "fak_prefix_cache_hits_total",
                 'fak_http_requests_total{route="/v1/completions",status="200"}'):
        assert name in text, name
    assert server.metric("fak_inter_token_latency_seconds_count") >= 5  # 6 tokens: 5 gaps, at least


def test_logprobs_from_the_logits_same_in_stream_and_not(server: Server) -> None:
    c = server.client()
    msgs = [{"role": "user", "content": "hi"}]
    whole = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0, logprobs=True,
                                      top_logprobs=3)
    entries = whole.choices[0].logprobs.content
    assert len(entries) == whole.usage.completion_tokens == 8
    assert b"".join(bytes(e.bytes) for e in entries).decode("utf-8", "replace") == whole.choices[0].message.content
    for e in entries:  # greedy: the chosen token is the most likely one, and logprobs are <= 0, sorted
        assert len(e.top_logprobs) == 3 and e.top_logprobs[0].logprob == e.logprob <= 0
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)
    streamed = [lp for ch in c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0,
                                                         logprobs=True, top_logprobs=3, stream=True)
                if ch.choices and ch.choices[0].logprobs for lp in ch.choices[0].logprobs.content]
    assert [(e.token, e.logprob, [t.logprob for t in e.top_logprobs]) for e in streamed] == \
        [(e.token, e.logprob, [t.logprob for t in e.top_logprobs]) for e in entries]
    comp = c.completions.create(model=MODEL, prompt="hello", max_tokens=6, temperature=0, logprobs=2)
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6 and lp.text_offset[0] == 0
    plain = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2, temperature=0)
    assert plain.choices[0].logprobs is None
    r = httpx.post(server.url + "/v1/chat/completions", timeout=10,
                   json={"messages": msgs, "logprobs": True, "top_logprobs": 50})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"


def test_logit_bias_and_penalties_change_the_output(server: Server) -> None:
    c = server.client()
    forced = c.completions.create(model=MODEL, prompt="hello", max_tokens=6, temperature=0, logit_bias={"65": 100})
    assert forced.choices[0].text == "AAAAAA"
    plain = c.completions.create(model=MODEL, prompt="hello", max_tokens=24, temperature=0).choices[0].text
    tokens = len(plain.encode())
    penalised = c.completions.create(model=MODEL, prompt="hello", max_tokens=24, temperature=0,
                                     frequency_penalty=2.0, presence_penalty=2.0).choices[0].text
    assert tokens == 24 and len(set(penalised)) > len(set(plain))  # repeats are pushed down: more distinct bytes


@pytest.mark.slow
def test_live_view_on_a_terminal() -> None:
    import os
    import pty
    import select
    import subprocess
    import sys

    from support.serve_helpers import REPO

    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAK_")} | {"COLUMNS": "120", "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "commands.main", "serve", "--gguf", "synthetic", "--port", "0",
                             "--live"], stderr=slave, stdout=subprocess.DEVNULL, cwd=REPO, env=env)
    os.close(slave)
    seen, deadline = b"", time.monotonic() + 60
    try:
        while time.monotonic() < deadline and not (b"fak engine" in seen and b"requests" in seen):
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                seen += os.read(master, 65536)
    finally:
        proc.terminate()
        rc = proc.wait(timeout=30)
        os.close(master)
    assert b"fak engine" in seen and b"5xx" in seen, seen[-500:]
    assert rc == 0


@pytest.mark.slow
def test_fak_top_draws_a_running_server(server: Server) -> None:
    import subprocess
    import sys

    from engine.sched.preemption import Victim
    from engine.sched.stats import SchedStats

    s = SchedStats(running=2, finished={"length": 3}, last_victim=Victim(4, "cost-aware", "r", 0.5, "swap"))
    assert SchedStats.from_json(json.loads(json.dumps(s.to_json()))) == s
    stats = httpx.get(server.url + "/fak/stats", timeout=10).json()
    assert stats["model"] == MODEL and stats["sched"]["admitted"] >= 1 and stats["requests"] >= 1
    r = subprocess.run([sys.executable, "-m", "commands.main", "top", "--url", server.url, "--once"],
                       capture_output=True, text=True, timeout=60, env={"COLUMNS": "120", **__import__("os").environ})
    assert r.returncode == 0, r.stderr
    assert "fak engine" in r.stdout and "requests" in r.stdout and "5xx" in r.stdout
    bad = subprocess.run([sys.executable, "-m", "commands.main", "top", "--url", "http://127.0.0.1:9", "--once"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("fak: error: ") and len(bad.stderr.strip().splitlines()) == 1


def test_embeddings_are_the_models_pooled_state(server: Server) -> None:
    import base64

    import numpy as np

    from fak.runtime.boot import boot

    local = boot("synthetic", scheduler=False, show=False)  # the same deterministic checkpoint, in process
    c = server.client()
    texts = ["hello world", "héllo", "a much longer input about something else entirely"]
    many = c.embeddings.create(model=MODEL, input=texts)
    assert [d.index for d in many.data] == [0, 1, 2]
    assert many.usage.prompt_tokens == sum(len(local.tokenizer.encode(t)) for t in texts)
    for t, d in zip(texts, many.data, strict=False):
        got = np.asarray(d.embedding, dtype=np.float32)
        want = local.model.embed(local.tokenizer.encode(t))
        assert got.shape == (local.model.config.hidden,) and abs(float(np.linalg.norm(got)) - 1) < 1e-5
        assert np.max(np.abs(got - want)) < 1e-6
    one = c.embeddings.create(model=MODEL, input=texts[1])  # alone == in a batch
    assert one.data[0].embedding == many.data[1].embedding
    ids = local.tokenizer.encode(texts[0])
    assert c.embeddings.create(model=MODEL, input=ids).data[0].embedding == many.data[0].embedding
    raw = httpx.post(server.url + "/v1/embeddings", timeout=30,
                     json={"input": texts[0], "encoding_format": "base64"}).json()
    vec = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert vec.tolist() == many.data[0].embedding
    ctx = local.model.config.context_length
    for body, param in (({"input": ""}, "input"), ({"input": []}, "input"), ({"input": [[1, 300]]}, "input"),
                        ({"input": "x", "dimensions": 3}, "dimensions"), ({"input": [1] * (ctx + 1)}, "input"),
                        ({"input": "x", "encoding_format": "int8"}, "encoding_format")):
        r = httpx.post(server.url + "/v1/embeddings", json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)


@pytest.mark.slow
def test_json_logs_every_line_parses_with_an_access_log() -> None:
    s = Server("--gguf", "synthetic", "--json-logs")
    try:
        assert json.loads(s.lines[-1])["url"] == s.url  # the listening line itself is JSON
        s.client().completions.create(model=MODEL, prompt="log me", max_tokens=2)
        assert httpx.post(s.url + "/v1/completions", json={"prompt": "x", "bogus": 1}, timeout=10).status_code == 400
    finally:
        assert s.stop() == 0
    records = [json.loads(line) for line in s.lines + s.rest_of_stderr() if line.strip()]  # each line parses
    access = [r for r in records if r["logger"] == "fak.access"]
    assert [(r["route"], r["status"]) for r in access if r["method"] == "POST"] == \
        [("/v1/completions", 200), ("/v1/completions", 400)]
    assert all(r["duration_ms"] >= 0 and r["client"].startswith("127.0.0.1:") for r in access)
    assert any(r["logger"] == "fak.serve" and r["msg"].startswith("fak: synthetic") for r in records)  # boot line


@pytest.mark.gemma  # a cut copy of its file
@pytest.mark.slow
def test_a_model_that_fails_to_load_ends_the_server_with_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    from engine.gguf.aliases import resolve_model

    bad = tmp_path / "cut.gguf"
    with open(resolve_model("gemma3-270m"), "rb") as f:
        bad.write_bytes(f.read(1 << 20))  # the header parses, the metadata runs past the end
    r = subprocess.run([sys.executable, "-m", "commands.main", "serve", "--gguf", str(bad), "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and lines[-1].startswith("fak: error: ") and "cut.gguf" in lines[-1], r.stderr
    assert "Traceback" not in r.stderr


def test_kernel_counters_on_metrics() -> None:
    from fastapi.testclient import TestClient

    from fak.core.abi import ToolCall
    from fak.core.kernel import Kernel
    from fak.core.policy import coding_floor
    from fak.gateway import create_app
    from fak.gateway.config import ServeConfig

    kernel = Kernel.with_policy(coding_floor())
    app = create_app(lambda: None, ServeConfig(MODEL), background=False, kernel=kernel)
    kernel.submit(ToolCall("tool", "Bash", args=b'{"command": "rm -rf ~"}'))
    kernel.submit(ToolCall("tool", "Read", args=b'{"file_path": "README.md"}'))
    text = TestClient(app).get("/metrics").text
    assert "fak_kernel_submits_total 2.0" in text and "fak_kernel_denies_total 1.0" in text


@pytest.mark.slow
def test_structured_output_and_forced_calls_on_every_wire(server: Server) -> None:
    import anthropic
    import jsonschema

    c = server.client()
    # bounded values: the random synthetic model would write an integer's digits until max_tokens
    schema = {"type": "object", "properties": {"b": {"type": "boolean"}, "s": {"enum": ["a", "b"]}},
              "required": ["b", "s"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    msgs = [{"role": "user", "content": "hi"}]  # byte vocabulary: a token a character, and up to 32 blanks a gap
    r = c.chat.completions.create(model=MODEL, messages=msgs, response_format=fmt, temperature=0, max_tokens=600)  # type: ignore[arg-type]
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)  # the synthetic model only emits it forced
    resp = c.responses.create(model=MODEL, input="hi", text={"format": {"type": "json_schema", "name": "x",  # type: ignore[typeddict-item]
                                                                        "schema": schema}}, max_output_tokens=600)
    jsonschema.validate(json.loads(resp.output_text), schema)
    tool = {"type": "function", "function": {"name": "pick", "parameters": schema}}
    forced = c.chat.completions.create(model=MODEL, messages=msgs, tools=[tool], tool_choice="required", temperature=0,  # type: ignore[list-item]
                                       max_tokens=600)
    call = forced.choices[0].message.tool_calls[0]
    assert forced.choices[0].finish_reason == "tool_calls" and call.function.name == "pick"
    jsonschema.validate(json.loads(call.function.arguments), schema)
    # the kernel still decides: pick is offered, so the serving floor lets it through, and says so
    assert forced.model_extra["fak"]["adjudications"][0]["verdict"] == "ALLOW"
    a = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    m = a.messages.create(model=MODEL, max_tokens=600, messages=msgs, extra_body={"temperature": 0},  # type: ignore[arg-type]
                          tools=[{"name": "pick", "input_schema": schema}], tool_choice={"type": "any"})
    assert m.stop_reason == "tool_use" and m.content[-1].name == "pick"
    jsonschema.validate(m.content[-1].input, schema)
