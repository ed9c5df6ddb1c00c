"""token_logprob: the log softmax of the raw logits at the emitted token, and the k most likely, against the
slow reference (a float64 log softmax and a stable sort of the whole vocabulary)."""

from __future__ import annotations

import numpy as np

from engine.sched.output import token_logprob


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
