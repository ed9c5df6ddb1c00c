"""Sampling: greedy ties, temperature, top-k, top-p, seeds."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import EngineError
from engine.model.sampling import Sampler, SamplingParams, filtered_probs, greedy, sample


def test_greedy_ties_lowest_id() -> None:
    assert greedy(np.array([0.0, 3.0, 1.0, 3.0], dtype=np.float32)) == 1
    assert Sampler(SamplingParams(temperature=0.0, seed=1))(np.array([2.0, 2.0])) == 0


def test_top_k_restricts_support() -> None:
    logits = np.array([1.0, 5.0, 4.0, 3.0, 5.0], dtype=np.float32)
    probs = filtered_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert set(np.flatnonzero(probs)) == {1, 4}  # the tie at 5.0 keeps both; lower id first
    np.testing.assert_allclose(probs.sum(), 1.0)
    rng = np.random.default_rng(0)
    draws = {sample(logits, SamplingParams(temperature=1.0, top_k=2), rng) for _ in range(200)}
    assert draws == {1, 4}


def test_top_p_nucleus() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    probs = filtered_probs(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert list(np.flatnonzero(probs)) == [0, 1]
    np.testing.assert_allclose(probs[[0, 1]], [0.625, 0.375])
    probs = filtered_probs(logits, SamplingParams(temperature=1.0, top_p=0.01))
    assert list(np.flatnonzero(probs)) == [0]  # at least one token


def test_temperature_matches_softmax_frequencies() -> None:
    logits = np.array([0.0, 1.0, 2.0])
    p = SamplingParams(temperature=2.0, seed=123)
    s = Sampler(p)
    counts = np.bincount([s(logits) for _ in range(6000)], minlength=3) / 6000
    want = np.exp(logits / 2) / np.exp(logits / 2).sum()
    np.testing.assert_allclose(counts, want, atol=0.03)


def test_seed_reproduces() -> None:
    logits = np.random.default_rng(5).standard_normal(50)
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=20, seed=7)
    s1, s2, s3 = Sampler(p), Sampler(p), Sampler(SamplingParams(temperature=1.0, top_p=0.9, top_k=20, seed=8))
    seq1 = [s1(logits) for _ in range(30)]
    seq2 = [s2(logits) for _ in range(30)]
    seq3 = [s3(logits) for _ in range(30)]
    assert seq1 == seq2 and len(set(seq1)) > 1 and seq3 != seq1


@pytest.mark.parametrize("kw", [{"temperature": -1}, {"top_k": -2}, {"top_p": 0.0}, {"top_p": 1.5}])
def test_bad_params(kw: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(EngineError):
        SamplingParams(**kw)


def test_penalties_and_bias_follow_their_definitions() -> None:
    from engine.model.sampling import adjusted_logits

    x = np.array([2.0, -1.0, 0.5, 3.0, 0.0], np.float32)
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0, logit_bias={4: 1.5})
    got = adjusted_logits(x, p, generated=[3, 3, 1], prompt=[0])
    want = x.astype(np.float64).copy()
    want[4] += 1.5  # bias first
    for i in {0, 1, 3}:  # repetition: prompt and output ids, divided when positive, multiplied when not
        want[i] = want[i] / 2.0 if want[i] > 0 else want[i] * 2.0
    want[3] -= 0.5 + 0.25 * 2  # presence + frequency x count, output ids only
    want[1] -= 0.5 + 0.25 * 1
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert np.array_equal(x, [2.0, -1.0, 0.5, 3.0, 0.0])  # the input is left alone
    assert adjusted_logits(x, SamplingParams()) is x  # nothing to do: no copy
    rng = np.random.default_rng(0)
    assert sample(x, SamplingParams(logit_bias={1: 100.0}), rng) == 1  # bias steers greedy too


def test_min_p_drops_the_unlikely() -> None:
    x = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float64)).astype(np.float32)
    probs = filtered_probs(x, SamplingParams(temperature=1.0, min_p=0.2))  # keep p >= 0.1
    assert probs[3] == 0 and probs[:3].sum() == pytest.approx(1.0) and probs[0] == pytest.approx(0.5 / 0.95)
    with pytest.raises(EngineError):
        SamplingParams(min_p=1.5)
    with pytest.raises(EngineError):
        SamplingParams(repetition_penalty=0)
    with pytest.raises(EngineError):
        SamplingParams(repetition_penalty=5e-324)  # schemathesis found it: v / rp overflowed to inf


def test_tiny_temperature_is_greedy_not_nan() -> None:
    x = np.array([1.0, 3.0, 2.0], np.float32)
    probs = filtered_probs(x, SamplingParams(temperature=5e-324))
    assert probs.tolist() == [0.0, 1.0, 0.0]
    assert sample(x, SamplingParams(temperature=1e-300), np.random.default_rng(0)) == 1


def _cases() -> list[tuple[np.ndarray, SamplingParams]]:
    """Logits of several shapes (ties, a few huge ones, flat, peaked), each under many filter settings."""
    rng = np.random.default_rng(11)
    out = []
    for vocab in (1, 2, 7, 300, 5000, 70000):
        base = rng.standard_normal(vocab).astype(np.float32) * rng.choice([0.5, 3.0, 12.0])
        tied = np.round(base).astype(np.float32)  # many exact ties: ranks must go to the lower id
        for z in (base, tied):
            for kw in ({}, {"top_k": 1}, {"top_k": 5}, {"top_k": vocab + 3}, {"top_p": 0.5}, {"top_p": 0.95},
                       {"top_p": 0.999999}, {"min_p": 0.1}, {"min_p": 0.01, "top_p": 0.9},
                       {"top_k": 40, "top_p": 0.8}, {"top_k": 40, "top_p": 0.8, "min_p": 0.05}):
                for t in (0.3, 1.0, 2.5):
                    out.append((z, SamplingParams(temperature=t, **kw)))
    return out


def test_kept_is_the_reference_distribution_without_its_sort() -> None:
    from engine.model.sampling import kept

    for z, p in _cases():
        ref = filtered_probs(z, p)
        ids, probs = kept(z, p)
        assert list(ids) == list(np.flatnonzero(ref)), (z.size, p)  # the same tokens, ties and cuts included
        np.testing.assert_allclose(probs, ref[ids], rtol=1e-12, atol=1e-300)
        assert abs(probs.sum() - 1.0) < 1e-12


def test_a_draw_is_the_reference_draw_for_the_same_seed() -> None:
    """sample() draws what rng.choice over the reference distribution draws with the same generator state:
    seeded requests sample as they did when the whole vocabulary was sorted."""
    cases = _cases()[::7]
    big = (np.random.default_rng(3).standard_normal(262144) * 4).astype(np.float32)  # the two-level draw
    cases += [(big, SamplingParams(temperature=0.8)), (big, SamplingParams(temperature=1.0, top_p=0.9)),
              (big, SamplingParams(temperature=0.7, min_p=0.02))]
    for z, p in cases:
        ref = filtered_probs(z, p)
        nz = np.flatnonzero(ref)
        for seed in range(25):
            want = int(np.random.default_rng(seed).choice(nz, p=ref[nz] / ref[nz].sum()))
            assert sample(z, p, np.random.default_rng(seed)) == want, (z.size, p, seed)


def test_the_draw_at_the_edges_of_the_distribution() -> None:
    from engine.model.sampling import _draw

    w = np.zeros(4096)
    w[[5, 1000, 4000]] = [1.0, 2.0, 1.0]
    assert _draw(w, 0.0) == 5 and _draw(w, 0.2499) == 5 and _draw(w, 0.25) == 1000
    assert _draw(w, 0.75) == 4000 and _draw(w, np.nextafter(1.0, 0.0)) == 4000  # never past the last token
    assert _draw(np.array([0.0, 3.0, 0.0]), 0.999) == 1
