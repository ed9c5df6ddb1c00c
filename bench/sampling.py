"""What drawing one sampled token costs, side by side with the reference that sorts the whole vocabulary.

    python bench/sampling.py [--reps 50]

For the packaged models' vocabularies (Qwen 2.5: 151,936; Gemma 3: 262,144) and the usual settings
(temperature only, top-p, top-k + top-p, min-p), over logits of two shapes: real ones (the packaged
Gemma 3's next-token logits after a sentence: peaked, as a language model's are) and a broad synthetic
spread (N(0, 3): a nucleus of tens of thousands of tokens, the worst case for top-p). Prints ms per token
for `sample` (engine/model/sampling.py) and for the reference (`filtered_probs` + rng.choice, what sample
did before), the ratio, and whether both drew the same tokens from the same seeds.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from engine.model.sampling import SamplingParams, filtered_probs, sample
from fak.runtime.boot import SchedOptions, boot

SETTINGS = {
    "temperature 0.8": SamplingParams(temperature=0.8),
    "top-p 0.95": SamplingParams(temperature=0.8, top_p=0.95),
    "top-k 40, top-p 0.9": SamplingParams(temperature=0.7, top_k=40, top_p=0.9),
    "min-p 0.05": SamplingParams(temperature=1.0, min_p=0.05),
}


def reference(z: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> int:
    probs = filtered_probs(z, p)
    nz = np.flatnonzero(probs)
    return int(rng.choice(nz, p=probs[nz] / probs[nz].sum()))


def per_token(fn, z: np.ndarray, p: SamplingParams, reps: int) -> tuple[float, list[int]]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    fn(z, p, rng)
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    drawn = [fn(z, p, rng) for _ in range(reps)]
    return (time.perf_counter() - t) / reps * 1e3, drawn


def gemma_logits() -> np.ndarray:
    b = boot("gemma3-270m", sched=SchedOptions.resolve(env=False), scheduler=False, show=False)
    from engine import Session

    return Session(b.model).prefill(list(b.tokenizer.encode("The lighthouse keeper had not spoken to another")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    rng = np.random.default_rng(1)
    shapes = {"Gemma 3 logits (262,144)": np.asarray(gemma_logits(), dtype=np.float32).reshape(-1)}
    for v in (151936, 262144):
        shapes[f"broad N(0,3) ({v:,})"] = (rng.standard_normal(v) * 3).astype(np.float32)
    print(f"bench/sampling.py: {time.strftime('%Y-%m-%d %H:%M')}, {a.reps} draws each, ms per sampled token")
    for name, z in shapes.items():
        print(f"\n{name}")
        for label, p in SETTINGS.items():
            fast, d1 = per_token(sample, z, p, a.reps)
            slow, d2 = per_token(reference, z, p, a.reps)
            same = "same tokens" if d1 == d2 else f"{sum(x != y for x, y in zip(d1, d2, strict=True))} draws differ"
            print(f"  {label:22s} sample {fast:6.2f} ms   reference {slow:6.2f} ms   {slow / fast:5.1f}x   {same}")


if __name__ == "__main__":
    main()
