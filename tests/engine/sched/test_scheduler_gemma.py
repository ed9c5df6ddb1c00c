"""The scheduler on the real Gemma 3 270M (resident weights + its tokenizer): batched output equals
the one-request path, text streams, and swap preemption under a tight KV budget changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from engine import Session, load_model
from engine.gguf.aliases import resolve_model
from engine.sched.lane import FinishReason, Request
from engine.sched.scheduler import NativeScheduler
from engine.tokenizer.tokenizer import load_tokenizer

pytestmark = pytest.mark.gemma

def solo(model, ids: list[int], n: int, stop: tuple[int, ...]) -> list[int]:  # type: ignore[no-untyped-def]
    """The one-request reference: one Session, greedy, stop on an eos id (no scheduler)."""
    s, out = Session(model), []
    logits = s.prefill(ids)
    for _ in range(n):
        t = int(np.argmax(logits))
        if t in stop:
            break
        out.append(t)
        logits = s.step(t)
    s.free()
    return out


PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time", "2 + 2 =")


@pytest.fixture(scope="module")
def gemma():  # type: ignore[no-untyped-def]
    from engine.tokenizer import tokenizer as T
    path = resolve_model("gemma3-270m")
    yield load_model(str(path), resident=True, progress=False), load_tokenizer(str(path))
    T.clear_memo()  # leave no process-wide tokenizer behind (the tokenizer tests time cold loads)


@pytest.mark.slow
def test_batched_equals_one_request_path_and_streams_text(gemma) -> None:  # type: ignore[no-untyped-def]
    model, tok = gemma
    ids = [tok.encode(p) for p in PROMPTS]
    want = [solo(model, i, 8, tuple(tok.eos_ids)) for i in ids]
    with NativeScheduler(model, tokenizer=tok, max_running=4) as sched:
        hs = [sched.admit(Request(p, max_new_tokens=8)) for p in PROMPTS]
        text = ["".join(h.pieces(timeout=300)) for h in hs]
        res = [h.result(timeout=300) for h in hs]
    assert [r.token_ids for r in res] == want
    assert text == [r.text for r in res] == [tok.decode(w) for w in want]
    assert "Paris" in text[0] or "capital" in text[0]


def test_swap_under_pressure_on_gemma(gemma) -> None:  # type: ignore[no-untyped-def]
    model, tok = gemma
    prompts = [tok.encode(p) for p in PROMPTS]
    with NativeScheduler(model, tokenizer=tok) as sched:
        alone = [sched.admit(Request(p, max_new_tokens=10, stop_on_eos=False)).result(timeout=300).token_ids
                 for p in prompts[:3]]
    with NativeScheduler(model, tokenizer=tok, kv_blocks=6, block_tokens=4, preempt="swap",
                         victim="cost-aware", prefix_cache=False) as sched:
        hs = [sched.admit(Request(p, max_new_tokens=10, stop_on_eos=False)) for p in prompts[:3]]
        res = [h.result(timeout=300) for h in hs]
        st = sched.stats()
    assert st.preemptions_swap > 0 and st.swap_bytes_in == st.swap_bytes_out
    assert all(r.finish_reason is FinishReason.LENGTH for r in res)
    assert [r.token_ids for r in res] == alone


def test_the_same_prompt_again_on_gemma_maps_its_tail_and_changes_no_bit(gemma) -> None:  # type: ignore[no-untyped-def]
    """The resident quantized kernels: a repeated prompt maps its whole 64-token chunks (BLAS) and the
    full blocks of its last, row-stable chunk, prefills the rest, and its logprobs are a cold run's bit
    for bit (the tail's rows give the same bits however they are split)."""
    model, tok = gemma
    ids = tok.encode(" ".join(f"Item {i} is filed under shelf {i % 7}." for i in range(16)))
    assert len(ids) % 64 > 16  # a tail chunk with a full block in it
    req = Request(ids, max_new_tokens=8, stop_on_eos=False, logprobs=0)
    with NativeScheduler(model, tokenizer=tok) as sched:
        cold = sched.admit(req).result(timeout=300)
        warm = sched.admit(Request(ids, max_new_tokens=8, stop_on_eos=False, logprobs=0)).result(timeout=300)
    assert cold.prefix_hit_tokens == 0
    assert warm.prefix_hit_tokens == (len(ids) - 1) // 16 * 16 > len(ids) // 64 * 64
    assert warm.token_ids == cold.token_ids
    assert [a.logprob for a in warm.logprobs] == [b.logprob for b in cold.logprobs]
