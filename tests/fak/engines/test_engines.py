"""Engines: registry, mock echo + token accounting, http against a tiny local OpenAI-compatible server."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fak.core.abi import LifecycleEngine, Status, ToolCall, as_lifecycle
from fak.engines import get_engine, known_engines, register_engine
from fak.engines.http import HttpEngine
from fak.engines.mock import MockEngine
from fak.errors import FakError


# -- registry ------------------------------------------------------------------------------------
def test_registry_known_and_unknown() -> None:
    assert {"mock", "http", "inkernel"} <= set(known_engines())
    assert isinstance(get_engine("mock"), MockEngine)
    with pytest.raises(FakError, match=r"unknown engine 'nope' \(known: .*mock"):
        get_engine("nope")


def test_register_engine() -> None:
    register_engine("echo2", lambda **o: MockEngine(reply="fixed", **o))
    assert get_engine("echo2").complete(ToolCall.from_args("t", {})).text == "fixed"
    register_engine("strict", lambda reply="x": MockEngine(reply=reply))
    with pytest.raises(FakError, match=r"engine 'strict': bad options \['colour'\]"):
        get_engine("strict", colour="red")
    register_engine("lazy-missing", "fak.engines.does_not_exist:X")
    with pytest.raises(FakError, match="not available"):
        get_engine("lazy-missing")


def test_importing_fak_does_not_import_engines() -> None:
    code = (
        "import sys, fak, fak.core.abi, fak.core.kernel, fak.core.policy, fak.core.journal, fak.engines\n"
        "bad = [m for m in ('numpy', 'numba', 'fak.engines.inkernel', 'engine', 'httpx') if m in sys.modules]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


# -- mock ----------------------------------------------------------------------------------------
MOCK_TABLE = [
    (ToolCall.from_args("Bash", {"command": "ls -la"}), 'Bash {"command":"ls -la"}', 2, 3),
    (ToolCall.from_args("llm", {"prompt": "hello big world"}, op="complete"), "hello big world", 3, 3),
    (ToolCall.from_args("llm", {"messages": [{"role": "user", "content": "a b"}]}, op="complete"), "a b", 2, 2),
    (ToolCall.from_args("X", {"prompt": "p q"}, meta={"mock_reply": "r s t"}), "r s t", 2, 3),
]


@pytest.mark.parametrize("call,text,n_in,n_out", MOCK_TABLE)
def test_mock_echo(call: ToolCall, text: str, n_in: int, n_out: int) -> None:
    eng = MockEngine()
    r = eng.complete(call)
    assert r.status is Status.OK and r.text == text
    assert r.payload["usage"] == {"prompt_tokens": n_in, "completion_tokens": n_out}  # type: ignore[index]
    assert (eng.prompt_tokens, eng.completion_tokens, eng.calls) == (n_in, n_out, 1)
    assert eng.complete(call).payload == r.payload  # deterministic


def test_mock_streams_and_fails() -> None:
    req = MockEngine().admit(ToolCall.from_args("x", {}, meta={"mock_reply": "one two  three"}))
    pieces = list(req.tokens())
    assert pieces == ["one", " two", "  three"] and "".join(pieces) == req.result().text
    assert MockEngine(fail=True).complete(ToolCall.from_args("x", {})).status is Status.ERROR
    req = MockEngine().admit(ToolCall.from_args("x", {}, meta={"mock_reply": "a b c d"}))
    it = req.tokens()
    assert next(it) == "a"
    req.cancel()  # mid-stream: no more pieces, the result that was computed stays
    assert list(it) == [] and req.result().text == "a b c d"


def test_oneshot_wrapper() -> None:
    class OneShot:
        def complete(self, call: ToolCall):  # type: ignore[no-untyped-def]
            return MockEngine(reply="whole text").complete(call)

        def caps(self):  # type: ignore[no-untyped-def]
            return {}

    eng = as_lifecycle(OneShot())
    assert isinstance(eng, LifecycleEngine)
    req = eng.admit(ToolCall.from_args("x", {}))
    assert list(req.tokens()) == ["whole text"] and req.result().ok
    cancelled = eng.admit(ToolCall.from_args("x", {}))
    cancelled.cancel()
    assert cancelled.result().status is Status.ERROR and list(cancelled.tokens()) == []
    mock = MockEngine()
    assert as_lifecycle(mock) is mock  # already has admit


# -- http ----------------------------------------------------------------------------------------
class _Upstream(BaseHTTPRequestHandler):
    def log_message(self, *a: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path.startswith("/slow"):
            time.sleep(1.5)
        if self.path.startswith("/fail"):
            self._send(500, b'{"error": "boom"}')
        elif self.path.startswith("/junk"):
            self._send(200, b"not json")
        elif self.path.startswith("/oddusage"):
            self._send(200, b'{"choices": [{"message": {"content": "ok"}}], "usage": {"prompt_tokens": "many"}}')
        else:
            text = "echo: " + body["messages"][-1]["content"]
            reply = {"model": body["model"], "auth": self.headers.get("authorization"),
                     "choices": [{"message": {"role": "assistant", "content": text}}],
                     "usage": {"prompt_tokens": 7, "completion_tokens": 3}}
            self._send(200, json.dumps(reply).encode())

    def _send(self, code: int, data: bytes) -> None:
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the timed-out client hangs up before /slow answers: expected


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    srv = _QuietServer(("127.0.0.1", 0), _Upstream)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_http_success(upstream: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", "sk-test")
    eng = HttpEngine(base_url=upstream + "/ok", model="m1", api_key_env="MY_KEY", timeout=5)
    r = eng.complete(ToolCall.from_args("llm", {"prompt": "hi"}))
    assert r.status is Status.OK and r.text == "echo: hi"
    assert r.payload["model"] == "m1" and r.payload["usage"] == {"prompt_tokens": 7, "completion_tokens": 3}  # type: ignore[index]
    assert (r.meta["input_tokens"], r.meta["output_tokens"]) == (7, 3)
    assert eng.url.endswith("/ok/v1/chat/completions")


def test_http_env_config(upstream: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAK_HTTP_BASE_URL", upstream + "/ok/v1")
    monkeypatch.setenv("FAK_HTTP_MODEL", "envmodel")
    r = get_engine("http").complete(ToolCall.from_args("Bash", {"command": "ls"}))
    assert r.ok and r.text == 'echo: Bash {"command":"ls"}' and r.payload["model"] == "envmodel"  # type: ignore[index]


@pytest.mark.parametrize("path,timeout,needle", [
    ("/fail", 5.0, "upstream HTTP 500"),
    ("/junk", 5.0, "not a chat completion"),
    ("/slow", 0.3, "timeout after 0.3s"),
])
def test_http_errors_are_results(upstream: str, path: str, timeout: float, needle: str) -> None:
    r = HttpEngine(base_url=upstream + path, timeout=timeout).complete(ToolCall.from_args("llm", {"prompt": "x"}))
    assert r.status is Status.ERROR and needle in r.payload["error"]  # type: ignore[index]


def test_http_odd_usage_counts_zero(upstream: str) -> None:
    r = HttpEngine(base_url=upstream + "/oddusage", timeout=5).complete(ToolCall.from_args("llm", {"prompt": "x"}))
    assert r.ok and r.text == "ok" and (r.meta["input_tokens"], r.meta["output_tokens"]) == (0, 0)


def test_http_connection_refused() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    r = HttpEngine(base_url=f"http://127.0.0.1:{port}", timeout=2).complete(ToolCall.from_args("llm", {"prompt": "x"}))
    assert r.status is Status.ERROR and "cannot connect" in r.payload["error"]  # type: ignore[index]


def test_http_needs_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FAK_HTTP_BASE_URL", raising=False)
    with pytest.raises(FakError, match="FAK_HTTP_BASE_URL"):
        HttpEngine()
    with pytest.raises(FakError, match="must start with http"):
        HttpEngine(base_url="ftp://x")
    for bad in ("-1", "nan", "0"):
        monkeypatch.setenv("FAK_HTTP_TIMEOUT", bad)
        with pytest.raises(FakError, match="timeout must be a positive number"):
            HttpEngine(base_url="http://127.0.0.1:9")
