"""Token sampling: greedy (ties -> lowest id), temperature, top-k, top-p, seeded."""

from __future__ import annotations

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

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise EngineError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise EngineError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise EngineError(f"top_p must be in (0, 1], got {self.top_p}")


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
    z = logits.astype(np.float64) / p.temperature
    order = np.argsort(-z, kind="stable")  # descending; ties keep the lower id first
    if p.top_k > 0:
        order = order[: p.top_k]
    zs = z[order]
    probs = np.exp(zs - zs[0])
    probs /= probs.sum()
    if p.top_p < 1.0:
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
        probs = probs[:keep] / probs[:keep].sum()
        order = order[:keep]
    out = np.zeros(logits.shape[0], dtype=np.float64)
    out[order] = probs
    return out


def sample(logits: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> int:
    if p.temperature == 0.0:
        return greedy(logits)
    probs = filtered_probs(logits, p)
    nz = np.flatnonzero(probs)
    return int(rng.choice(nz, p=probs[nz] / probs[nz].sum()))
