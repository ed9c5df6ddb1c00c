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
    """The distribution sampled from: softmax(logits / T) restricted to top-k, then to the top-p nucleus."""
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


def sample(logits: np.ndarray, p: SamplingParams, rng: np.random.Generator, generated: Sequence[int] = (),
           prompt: Sequence[int] = ()) -> int:
    logits = adjusted_logits(logits, p, generated, prompt)
    if p.temperature == 0.0:
        return greedy(logits)
    probs = filtered_probs(logits, p)
    nz = np.flatnonzero(probs)
    return int(rng.choice(nz, p=probs[nz] / probs[nz].sum()))
