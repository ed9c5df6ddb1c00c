"""Speculative decoding on the packaged models: Gemma 3 270M (base) and Qwen2.5-Coder 0.5B (instruct),
resident, through the scheduler with real n-gram drafts and with scripted wrong ones: the greedy tokens
are the plain Session's, one token per step."""

from __future__ import annotations

import pytest

from engine import load_model
from engine.gguf.aliases import resolve_model
from engine.sched.lane import Request
from engine.sched.scheduler import NativeScheduler
from engine.tokenizer.tokenizer import load_tokenizer
from support.sched_helpers import ScriptedDrafter, use_drafter

pytestmark = pytest.mark.slow  # boots a model or a server per module: the full suite runs it

CODE = ("def parse(rows):\n    out = []\n    for row in rows:\n        out.append(row.strip())\n    return out\n\n"
        "def parse_all(files):\n    out = []\n    for f in files:\n        out.append(parse(f))\n    return out\n")


def _run(sched: NativeScheduler, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Each prompt alone (so the steps count is the sum of each request's)."""
    out = []
    for p in prompts:
        h = sched.admit(Request(p, max_new_tokens=n, stop_on_eos=False))
        while sched.step():
            pass
        out.append(h.result(0).token_ids)
    return out


def _check(alias: str, texts: list[str], n: int, chat: bool) -> None:
    from engine.tokenizer import tokenizer as T

    path = resolve_model(alias)
    model, tok = load_model(str(path), resident=True, progress=False), load_tokenizer(str(path))
    T.clear_memo()  # leave no process-wide tokenizer behind (the tokenizer tests time and check cold loads)
    prompts = [list(tok.encode(tok.apply_chat_template([{"role": "user", "content": t}]) if chat else t))
               for t in texts]
    plain = NativeScheduler(model, prefill_chunk=1024, eos_ids=(), prefix_cache=False, thread=False)
    want = _run(plain, prompts, n)
    answers = {tuple(p): w for p, w in zip(prompts, want, strict=True)}
    vocab = int(model.config.vocab_size)
    real = NativeScheduler(model, prefill_chunk=1024, speculative="ngram", eos_ids=(), prefix_cache=False, thread=False)
    scripted = use_drafter(NativeScheduler(model, prefill_chunk=1024, speculative="ngram", eos_ids=(),
                                           prefix_cache=False, thread=False),
                           ScriptedDrafter(answers, k=4, wrong_every=3, vocab=vocab))
    for sched in (real, scripted):
        assert _run(sched, prompts, n) == want
        assert sched.stats().spec_accepted > 0 and sched.pool.num_used == 0
    assert real.stats().steps < plain.stats().steps  # the real drafts were worth something here


@pytest.mark.gemma
def test_gemma_base_with_speculation() -> None:
    _check("gemma3-270m", ["One, two, three, four, five, six, seven, eight, nine, ten, one, two, three,",
                           CODE + "\n" + CODE[:60]], 40, chat=False)


@pytest.mark.qwen
@pytest.mark.slow
def test_qwen_instruct_with_speculation() -> None:
    _check("qwen2.5-coder-0.5b", [f"Return this code unchanged:\n```python\n{CODE}```",
                                  "Write the numbers from 1 to 30 separated by commas."], 48, chat=True)
