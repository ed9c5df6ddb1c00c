"""`fak serve` on Gemma 3 270M: 16 concurrent clients get what they get alone, clients that leave free
their lanes and KV blocks, and a full queue answers 429."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from support.serve_helpers import Server

pytestmark = [pytest.mark.serve, pytest.mark.gemma, pytest.mark.slow]
MODEL = "gemma3-270m"
PROMPTS = [f"{w} is a word that" for w in ("Sea", "Tree", "Stone", "River", "Cloud", "Fire", "Glass", "Bread",
                                            "Salt", "Iron", "Wolf", "Moon", "Rain", "Sand", "Silk", "Wind")]


@pytest.fixture(scope="module")
def server():  # type: ignore[no-untyped-def]
    s = Server("--gguf", MODEL)
    yield s
    assert s.stop() == 0


def _until(cond, timeout: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


def test_16_concurrent_greedy_equal_alone(server: Server) -> None:
    c = server.client(timeout=300)

    def ask(p: str) -> str:
        return c.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0).choices[0].text

    alone = [ask(p) for p in PROMPTS]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(ask, PROMPTS))
    assert together == alone
    assert server.metric("fak_sched_max_running_observed") >= 8  # they really ran together


def test_clients_that_leave_free_their_lanes(server: Server) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 2000, "temperature": 0}
    streams = []
    for _ in range(2):  # streaming clients: read the first event, then hang up
        cm = httpx.stream("POST", server.url + "/v1/completions", json=body | {"stream": True}, timeout=60)
        lines = cm.__enter__().iter_lines()
        next(lines)
        streams.append((cm, lines))  # the iterator kept: dropping it would close the stream now

    def non_stream() -> None:  # a non-streaming client that gives up after a second
        try:
            httpx.post(server.url + "/v1/completions", json=body, timeout=1.0)
        except httpx.TimeoutException:
            pass

    t = threading.Thread(target=non_stream)
    t.start()
    assert _until(lambda: server.metric("fak_num_requests_running") == 3), "the three never ran together"
    for cm, _ in streams:
        cm.__exit__(None, None, None)
    t.join()
    assert _until(lambda: server.metric("fak_num_requests_running") == 0 and
                  server.metric("fak_num_requests_waiting") == 0 and
                  server.metric("fak_kv_cache_usage_perc") == 0.0, timeout=10)
    assert server.metric('fak_request_success_total{finished_reason="cancelled",model_name="gemma3-270m"}') == 3


def test_full_queue_is_429_with_retry_after() -> None:
    s = Server("--gguf", MODEL, "--max-running", "1", "--max-queue", "1")
    try:
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 2000, "stream": True}
        held = []
        for _ in range(2):  # one running, one waiting
            cm = httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60)
            cm.__enter__()
            held.append(cm)
        assert _until(lambda: s.metric("fak_num_requests_waiting") == 1)
        r = httpx.post(s.url + "/v1/completions", json=body | {"stream": False}, timeout=30)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "queue_full"
        for cm in held:
            cm.__exit__(None, None, None)
        assert _until(lambda: s.metric("fak_num_requests_running") == 0 and s.metric("fak_num_requests_waiting") == 0)
    finally:
        assert s.stop() == 0


def test_logprob_tokens_spell_the_content(server: Server) -> None:
    c = server.client(timeout=120)
    r = c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0, logprobs=1)
    assert "".join(r.choices[0].logprobs.tokens) == r.choices[0].text
    s = c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0, logprobs=1,
                             stream=True)
    toks = [t for ch in s if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens]
    assert toks == r.choices[0].logprobs.tokens
