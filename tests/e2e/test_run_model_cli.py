"""`fak run MODEL [PROMPT]` on the synthetic checkpoint: stream, --json, REPL, bad input -> exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from engine import Session, synthetic_model
from engine.model.sampling import Sampler, SamplingParams

pytestmark = pytest.mark.slow  # boots a model or a server per module: the full suite runs it


def fak(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "commands.main", "run", *args], capture_output=True, text=True,
                          input=stdin, timeout=180)


def _greedy(ids: list[int], n: int) -> list[int]:
    s, out = Session(synthetic_model()), []
    logits = s.prefill(ids)
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = s.step(out[-1])
    return out


def test_json_object_greedy_ids() -> None:
    r = fak("synthetic", "--ids", "104,105,32", "--max-tokens", "6", "--json")
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert set(obj) == {"model", "prompt_ids", "generated_ids", "text", "prefill_tok_s", "decode_tok_s"}
    assert obj["model"] == "synthetic" and obj["prompt_ids"] == [104, 105, 32]
    assert obj["generated_ids"] == _greedy([104, 105, 32], 6)
    assert obj["text"] == bytes(obj["generated_ids"]).decode("utf-8", "replace")
    assert obj["prefill_tok_s"] > 0 and obj["decode_tok_s"] > 0


def test_stream_text_and_stats() -> None:
    r = fak("synthetic", "hi ", "--max-tokens", "5")
    assert r.returncode == 0, r.stderr
    assert r.stdout == bytes(_greedy(list(b"hi "), 5)).decode("utf-8", "replace") + "\n"
    assert "prompt: 3 tokens" in r.stderr and "decode: 5 tokens" in r.stderr and "tok/s" in r.stderr


def test_system_prompt_goes_first() -> None:
    # The synthetic model has no chat template: the system text leads the prompt, a blank line apart.
    r = fak("synthetic", "hi", "--system", "Be brief.", "--max-tokens", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["prompt_ids"] == list(b"Be brief.\n\nhi")


def _sampled(ids: list[int], n: int, sp: SamplingParams) -> list[int]:
    """The engine's Sampler step by step on a plain Session: what `fak run --temp ... --seed ...` must print."""
    m = synthetic_model()
    m.prefill_blas = False  # a prompt shorter than a prefill chunk goes through the scheduler's row-stable rows
    s, sampler, out = Session(m), Sampler(sp), []
    logits = s.prefill(ids)
    for _ in range(n):
        out.append(sampler(logits))
        logits = s.step(out[-1])
    return out


def test_sampling_follows_temperature_top_k_and_seed() -> None:
    def run(*extra: str) -> list[int]:
        r = fak("synthetic", "--ids", "1,2", "--max-tokens", "8", *extra, "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["generated_ids"]

    a = run("--temp", "1.5", "--top-k", "50", "--seed", "3")
    assert a == run("--temp", "1.5", "--top-k", "50", "--seed", "3")  # reproducible
    assert a == _sampled([1, 2], 8, SamplingParams(temperature=1.5, top_k=50, seed=3))
    b = run("--temp", "1.5", "--top-k", "50", "--seed", "4")
    assert b == _sampled([1, 2], 8, SamplingParams(temperature=1.5, top_k=50, seed=4)) and b != a
    c = run("--temp", "2", "--top-p", "0.8", "--seed", "3")  # the nucleus reaches the engine too
    assert c == _sampled([1, 2], 8, SamplingParams(temperature=2.0, top_p=0.8, seed=3))
    assert c != _sampled([1, 2], 8, SamplingParams(temperature=2.0, seed=3))
    greedy = run("--seed", "3")  # --temp 0 (the default): the seed changes nothing
    assert greedy == _greedy([1, 2], 8) and greedy not in (a, b, c)


def test_repl_until_eof() -> None:
    r = fak("synthetic", "--max-tokens", "3", stdin="ab\ncd\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(">>> ") == 3  # two prompts, then the one that reads EOF
    assert r.stderr.count("decode: 3 tokens") == 2


def test_bad_input_one_line_exit_2() -> None:
    for args in (["synthetic", "--ids", "1,x"], ["synthetic", "--ids", "999"], ["/no/such.gguf", "hi"],
                 ["synthetic", "hi", "--top-p", "0"], ["synthetic", "hi", "--temp", "-1"]):
        r = fak(*args)
        assert r.returncode == 2, (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("fak: error: "), (args, r.stderr)
    import os

    r = fak("synthetic", os.fsdecode(b"h\xffi"))  # argv bytes that are not UTF-8
    assert r.returncode == 2 and r.stderr.strip() == "fak: error: prompt: not valid UTF-8 (byte b'\\xff' at character 1)"
    r = fak("synthetic", "--ids", "3,-5")
    assert r.returncode == 2 and r.stderr.strip() == "fak: error: --ids: token id -5 out of range for vocab 256"


def test_ids_on_a_gguf_without_tokenizer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from support.ggufgen import tiny_llama_gguf

    p = tiny_llama_gguf(tmp_path / "novocab.gguf")
    r = fak(str(p), "--ids", "1,2,3", "--max-tokens", "4")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.split()) == 4 and all(t.isdigit() for t in r.stdout.split())  # ids, no text
    r = fak(str(p), "hi")
    assert r.returncode == 2 and "tokenizer" in r.stderr
