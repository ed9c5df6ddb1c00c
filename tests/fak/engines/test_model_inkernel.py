"""The `inkernel` engine through the registry: lazy model, bounded prompt, greedy decode, payload/meta."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from engine import Session, synthetic_model
from fak.core.abi import ToolCall
from fak.engines import get_engine


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FAK_MODEL", raising=False)
    monkeypatch.delenv("FAK_MODEL_DIR", raising=False)


def test_lazy_and_synthetic_by_default() -> None:
    e = get_engine("inkernel")
    assert e.caps()["loaded"] is False and e.caps()["model"] == "synthetic"
    r = e.complete(ToolCall.from_args("search", {"prompt": "hello"}))
    assert r.ok
    s = Session(synthetic_model())
    logits, want = s.prefill(list(b"hello")), []
    for _ in range(16):
        want.append(int(np.argmax(logits)))
        logits = s.step(want[-1])
    assert r.payload == {"tool": "search", "engine": "inkernel", "model": "synthetic", "generated_tokens": want,
                         "generated_text": bytes(want).decode("utf-8", "replace")}
    assert r.meta["input_tokens"] == 5 and r.meta["output_tokens"] == 16
    assert e.caps()["loaded"] is True
    e.close()  # the scheduler's loop thread must not outlive the engine


def test_prompt_is_bounded_and_options() -> None:
    e = get_engine("inkernel", prompt_tokens=10, max_tokens=3)
    r = e.complete(ToolCall.from_args("write", {"path": "/tmp/x", "body": "y" * 500}))
    assert r.ok and r.meta["input_tokens"] == 10 and len(r.payload["generated_tokens"]) == 3
    assert e.prompt_ids(ToolCall.from_args("write", {"a": 1})) == list(b'write {"a":1}')[:10]
    e.close()


def test_env_model_and_missing_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAK_MODEL", "/no/such/model.gguf")
    e = get_engine("inkernel")
    r = e.complete(ToolCall.from_args("t", {}))
    assert not r.ok and "/no/such/model.gguf" in r.payload["error"]
    from fak.errors import FakError

    with pytest.raises(FakError, match="no such model file"):
        e.preload()


def test_import_is_cheap() -> None:
    import subprocess

    code = "import fak.engines.inkernel, sys; print('numba' in sys.modules, 'engine.model.forward' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout.split()
    assert out == ["False", "False"]


def test_weights_only_gguf_takes_bytes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # No vocabulary in the GGUF: the prompt is its UTF-8 bytes (ids), the result has ids and no text.
    from support.ggufgen import tiny_llama_gguf

    p = tiny_llama_gguf(tmp_path / "weights-only.gguf", kv={"llama.vocab_size": 300},
               tensors={"token_embd.weight": np.random.default_rng(1).standard_normal((300, 32)).astype(np.float32)})
    e = get_engine("inkernel", gguf=str(p), max_tokens=4)
    try:
        e.preload()
        r = e.complete(ToolCall.from_args("t", {"prompt": "hi"}))
        assert r.ok, r.payload
        assert r.meta["input_tokens"] == 2 and len(r.payload["generated_tokens"]) == 4
        assert e.prompt_ids(ToolCall.from_args("t", {"prompt": "hi"})) == list(b"hi")
    finally:
        e.close()
