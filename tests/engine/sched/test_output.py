"""token_logprob: the log softmax of the raw logits at the emitted token, and the k most likely, against the
slow reference (a float64 log softmax and a stable sort of the whole vocabulary). presample: a step's first
rows drawn on two threads are the tokens drawn in turn."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import engine.sched.output as output
from engine.model.sampling import SamplingParams
from engine.sched.lane import Request
from engine.sched.output import token_logprob
from engine.sched.scheduler import NativeScheduler
from support.sched_helpers import ScriptedDrafter, model, rand_prompt, run_to_end, use_drafter


def reference(z: np.ndarray, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    x = z.astype(np.float64)
    lp = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
    order = np.argsort(-x, kind="stable")[:k]  # ties: the lower id first
    return float(lp[token]), [(int(i), float(lp[i])) for i in order]


def test_logprobs_and_the_top_k_are_the_references() -> None:
    rng = np.random.default_rng(4)
    for vocab in (1, 3, 50, 4096, 262144):
        base = (rng.standard_normal(vocab) * 4).astype(np.float32)
        for z in (base, np.round(base).astype(np.float32)):  # the rounded ones tie everywhere
            for k in (0, 1, 5, 20):
                k = min(k, vocab)
                token = int(rng.integers(vocab))
                got = token_logprob(z, token, k)
                want_lp, want_top = reference(z, token, k)
                assert got.token == token and abs(got.logprob - want_lp) < 1e-9
                assert [i for i, _ in got.top] == [i for i, _ in want_top], (vocab, k)
                np.testing.assert_allclose([v for _, v in got.top], [v for _, v in want_top], atol=1e-9)


def test_ties_at_the_kth_value_go_to_the_lowest_ids() -> None:
    z = np.zeros(1000, dtype=np.float32)
    z[[900, 700, 3, 500]] = 1.0
    assert [i for i, _ in token_logprob(z, 0, 2).top] == [3, 500]
    assert [i for i, _ in token_logprob(z, 0, 6).top] == [3, 500, 700, 900, 0, 1]


def _sampled(sched: NativeScheduler, reqs: list[Request]) -> list[list[int]]:
    return [r.token_ids for r in run_to_end(sched, reqs)]


def test_rows_drawn_on_two_threads_are_the_rows_drawn_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded lanes (temperature, top-k, top-p, penalties) give the same tokens whether their first rows are
    drawn one after another on the loop thread or split with the helper thread; with drafts (a verifying
    lane's first row is presampled, its further rows drawn in turn), right and wrong ones, too."""
    rng = np.random.default_rng(21)
    prompts = [rand_prompt(rng, n) for n in (5, 9, 14, 20, 7, 11)]
    sps = [SamplingParams(temperature=t, top_k=k, top_p=tp, seed=i, presence_penalty=pp)
           for i, (t, k, tp, pp) in enumerate([(1.0, 0, 1.0, 0.0), (0.8, 40, 0.95, 0.0), (1.5, 0, 0.9, 0.5),
                                               (0.6, 8, 1.0, 0.0), (1.2, 0, 1.0, 1.0), (0.9, 0, 0.8, 0.0)])]
    reqs = [Request(p, max_new_tokens=24, sampling=sp) for p, sp in zip(prompts, sps, strict=True)]
    monkeypatch.setattr(output, "PARALLEL_ROWS", 1 << 30)  # never: every row drawn in turn
    ref = _sampled(NativeScheduler(model(), prefill_chunk=16, thread=False), reqs)
    monkeypatch.setattr(output, "PARALLEL_ROWS", 4)
    monkeypatch.setattr(output, "PARALLEL_VOCAB", 1)  # the synthetic model's small vocabulary qualifies
    threads: list[str] = []
    draw = output.sample

    def counted(*a, **k):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread().name)
        return draw(*a, **k)

    monkeypatch.setattr(output, "sample", counted)
    plain = NativeScheduler(model(), prefill_chunk=16, thread=False)
    assert _sampled(plain, reqs) == ref
    assert any(t.startswith("fak-sample") for t in threads)  # the helper drew rows
    plain.close()
    answers = {tuple(r.prompt): t for r, t in zip(reqs, ref, strict=True)}
    spec = use_drafter(NativeScheduler(model(), prefill_chunk=16, speculative="ngram", thread=False),
                       ScriptedDrafter(answers, k=4, wrong_every=3))
    assert _sampled(spec, reqs) == ref
    assert spec.stats().spec_accepted > 0
    spec.close()
