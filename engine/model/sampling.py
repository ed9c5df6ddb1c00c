"""Token sampling: greedy (ties -> lowest id), temperature, top-k, top-p, min-p, seeded; logit bias and
presence / frequency / repetition penalties (OpenAI's and vLLM's definitions) applied to the logits first."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.errors import EngineError


def greedy(logits: np.ndarray) -> int:
    """argmax; np.argmax returns the first (lowest) id among ties."""
    return int(np.argmax(logits))


@dataclass
class SamplingParams:
    temperature: float = 0.0  # 0 -> greedy
    top_k: int = 0  # 0 -> off
    top_p: float = 1.0  # 1 -> off
    seed: int | None = None
    min_p: float = 0.0  # drop tokens below min_p x the top probability; 0 -> off
    presence_penalty: float = 0.0  # minus this for every token already generated
    frequency_penalty: float = 0.0  # minus this x how often it was generated
    repetition_penalty: float = 1.0  # tokens of the prompt or the output: logit / rp if > 0 else x rp
    logit_bias: dict[int, float] | None = None  # added to those ids' logits

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise EngineError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise EngineError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise EngineError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise EngineError(f"min_p must be in [0, 1], got {self.min_p}")
        if not (-2.0 <= self.presence_penalty <= 2.0 and -2.0 <= self.frequency_penalty <= 2.0):
            raise EngineError("presence_penalty and frequency_penalty must be in [-2, 2]")
        if not 0.01 <= self.repetition_penalty <= 100.0:  # beyond, float32 logits overflow to inf (NaN probs)
            raise EngineError(f"repetition_penalty must be in [0.01, 100], got {self.repetition_penalty}")

    @property
    def adjusts_logits(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias)


def adjusted_logits(logits: np.ndarray, p: SamplingParams, generated: Sequence[int] = (),
                    prompt: Sequence[int] = ()) -> np.ndarray:
    """The logits sampling sees: bias added, then the repetition penalty (prompt and output ids, vLLM),
    then presence and frequency penalties (output ids, OpenAI). The input is not modified."""
    if not p.adjusts_logits:
        return logits
    z = logits.astype(np.float32, copy=True)
    for i, b in (p.logit_bias or {}).items():
        z[i] += np.float32(b)
    if p.repetition_penalty != 1.0:
        seen = np.fromiter(set(prompt) | set(generated), dtype=np.int64)
        if seen.size:
            v = z[seen]
            z[seen] = np.where(v > 0, v / np.float32(p.repetition_penalty), v * np.float32(p.repetition_penalty))
    if generated and (p.presence_penalty or p.frequency_penalty):
        counts = Counter(generated)
        ids = np.fromiter(counts.keys(), dtype=np.int64)
        n = np.fromiter(counts.values(), dtype=np.float32)
        z[ids] -= np.float32(p.presence_penalty) + np.float32(p.frequency_penalty) * n
    return z


@dataclass
class Sampler:
    """Stateful sampler: one seeded generator per request, so a seed reproduces a sequence."""

    params: SamplingParams = field(default_factory=SamplingParams)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.params.seed)

    def __call__(self, logits: np.ndarray) -> int:
        return sample(logits, self.params, self.rng)


def filtered_probs(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The distribution sampled from: softmax(logits / T) restricted to top-k, then min-p, then the top-p
    nucleus (tokens ranked by logit, ties to the lower id). The slow, obvious statement of it (a sort of the
    whole vocabulary): `kept` finds the same tokens and probabilities without the sort, and is tested
    against this."""
    # shifted before the division: a tiny temperature then gives -inf and 0 (the argmax), never inf - inf
    z = logits.astype(np.float64)
    z = (z - z.max()) / p.temperature
    order = np.argsort(-z, kind="stable")  # descending; ties keep the lower id first
    if p.top_k > 0:
        order = order[: p.top_k]
    zs = z[order]
    probs = np.exp(zs - zs[0])
    probs /= probs.sum()
    if p.min_p > 0.0:  # probs is sorted, most likely first
        keep = max(1, int(np.count_nonzero(probs >= p.min_p * probs[0])))
        probs = probs[:keep] / probs[:keep].sum()
        order = order[:keep]
    if p.top_p < 1.0:
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
        probs = probs[:keep] / probs[:keep].sum()
        order = order[:keep]
    out = np.zeros(logits.shape[0], dtype=np.float64)
    out[order] = probs
    return out


def _id(ids: np.ndarray | None, pos: np.ndarray) -> np.ndarray:
    return pos if ids is None else ids[pos]


def ranked_first(z: np.ndarray, m: int, ids: np.ndarray | None = None) -> np.ndarray:
    """Positions of the m highest-ranked entries of z (logit descending, then id ascending; ids None: the
    positions are the ids), in rank order; a partition and a sort of m, not of all. Ties at the m-th value
    go to the lowest ids, as a stable sort of the whole would have them. (No arange of the vocabulary: a
    fresh 2 MB array costs ~1 ms of page faults.)"""
    n = z.size
    if m >= n:
        part = np.arange(n)
    else:
        t = np.partition(z, n - m)[n - m]  # the m-th highest value
        above = np.flatnonzero(z > t)
        tied = np.flatnonzero(z == t)
        part = np.concatenate([above, tied[np.argsort(_id(ids, tied), kind="stable")][: m - above.size]])
    return part[np.lexsort((_id(ids, part), -z[part].astype(np.float64)))]


def _nucleus(z: np.ndarray, ids: np.ndarray | None, w: np.ndarray, top_p: float) -> np.ndarray:
    """Positions of the smallest rank-order prefix whose share of w's mass reaches top_p (at least one).
    Only a head of the ranking is sorted: the entries whose weight (the top one's is 1) is at least tau, tau
    lowered 1000x at a time until the head holds top_p of the mass. The head is a prefix of the ranking
    (weight never decreases with the logit, and equal logits have equal weights), so the cut inside it is
    the cut of the whole."""
    total = w.sum()
    tau = 1e-3
    while True:
        head = np.flatnonzero(w >= tau) if tau > 0.0 else np.arange(w.size)
        if tau == 0.0 or w[head].sum() >= top_p * total:
            break
        tau = tau * 1e-3 if tau > 1e-300 else 0.0
    order = head[np.lexsort((_id(ids, head), -z[head].astype(np.float64)))]
    c = np.cumsum(w[order] / total)
    j = int(np.searchsorted(c, top_p))  # the first whose cumulative share reaches top_p
    return order[: j + 1]


def _weights(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray | None, np.ndarray]:
    """(ids ascending, or None for the whole vocabulary in order; their unnormalised weights)."""
    z = np.asarray(logits)
    ids: np.ndarray | None = None
    ranked = False  # ids in rank order, not ascending
    zmax = np.float64(z.max())
    if 0 < p.top_k < z.size:
        ids = ranked_first(z, p.top_k)
        z, ranked = z[ids], True
    # shifted before the division: a tiny temperature then gives -inf and 0 (the argmax), never inf - inf
    w = z.astype(np.float64)  # a copy; then in place (fresh 2 MB temporaries cost their page faults, 1.5 ms)
    w -= zmax
    w /= p.temperature
    np.exp(w, out=w)
    if p.min_p > 0.0:
        pos = np.flatnonzero(w >= p.min_p)  # the top token's weight is exp(0) = 1
        z, w, ids = z[pos], w[pos], (pos if ids is None else ids[pos])
    if p.top_p < 1.0:
        pos = _nucleus(z, ids, w, p.top_p)
        w, ids, ranked = w[pos], _id(ids, pos), True
    if ranked and ids is not None:
        o = np.argsort(ids)
        ids, w = ids[o], w[o]
    return ids, w


def kept(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The tokens sampling can draw, ids ascending, and their probabilities (float64, summing to 1): the
    distribution of `filtered_probs`, found without sorting the vocabulary (a sort of 262,144 logits took
    27 ms a token, five times a Gemma 3 decode step). Top-k is a partition; min-p a threshold; top-p sorts
    only the head of the ranking, growing it until the cut falls inside."""
    ids, w = _weights(logits, p)
    return (np.arange(w.size) if ids is None else ids), w / w.sum()


BLOCK = 256  # the draw's first level: sums of blocks of weights, then one block's running sum


def _draw(w: np.ndarray, u: float) -> int:
    """The index i with cumsum(w)[i-1] <= u * sum(w) < cumsum(w)[i]: inverse-CDF sampling with the uniform
    draw u. In two levels (block sums, then one block), as a running sum over 262,144 weights costs 0.75 ms."""
    n = w.size
    nb = n // BLOCK
    if nb < 4:
        cs = np.cumsum(w)
        i = int(np.searchsorted(cs, u * cs[-1], side="right"))
    else:
        sums = np.append(w[: nb * BLOCK].reshape(nb, BLOCK).sum(axis=1), w[nb * BLOCK:].sum())
        cs = np.cumsum(sums)
        target = u * cs[-1]
        b = min(int(np.searchsorted(cs, target, side="right")), sums.size - 1)
        base = cs[b - 1] if b else 0.0
        part = np.cumsum(w[b * BLOCK:(b + 1) * BLOCK])
        i = b * BLOCK + int(np.searchsorted(part, target - base, side="right"))
    if i >= n or w[i] <= 0.0:  # rounding at the very top: the last token that can be drawn
        i = int(np.flatnonzero(w[: min(i, n)])[-1]) if np.any(w[: min(i, n)] > 0.0) else int(np.flatnonzero(w)[0])
    return i


def sample(logits: np.ndarray, p: SamplingParams, rng: np.random.Generator, generated: Sequence[int] = (),
           prompt: Sequence[int] = ()) -> int:
    logits = adjusted_logits(logits, p, generated, prompt)
    if p.temperature == 0.0:
        return greedy(logits)
    ids, w = _weights(logits, p)
    # what rng.choice(ids, p=w / w.sum()) does: one uniform draw against the cumulative distribution,
    # ids ascending (the same draw maps to the same token, up to rounding at a boundary)
    i = _draw(w, float(rng.random()))
    return i if ids is None else int(ids[i])
