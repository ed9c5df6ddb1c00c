"""What the KV cache's element type does to the logits: f16 and bf16 against f32 (and HF float32 with --hf).

    python bench/kv_dtype.py [--model qwen2.5-coder-0.5b] [--tokens 2048,8192] [--steps 16] [--hf]

For each prompt length N (text from the repo's README and docs, repeated as needed), the prompt goes through
Session.prefill in 64-token chunks (as the scheduler sends it), then `--steps` decode steps fed the f32 run's
greedy tokens (teacher-forced, so every type is compared on the same positions). Reported per type: max and
median |logit - f32 logit| over the chunk ends and the decode steps, how many of those positions change their
argmax, and the greedy tokens of a free-running decode vs f32's. With --hf the same positions against
transformers' float32 forward (dequantized GGUF; slow and memory-hungry past a few thousand tokens).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHUNK = 64


def _text_ids(tok, n: int) -> list[int]:  # type: ignore[no-untyped-def]
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    ids: list[int] = []
    while len(ids) < n:
        ids += tok.encode(text)
    return ids[:n]


def _run(model, ids: list[int], forced: list[int] | None, steps: int) -> tuple[np.ndarray, list[int]]:  # type: ignore[no-untyped-def]
    """Logits at every chunk end and after each decode step; the tokens fed (forced, else greedy)."""
    from engine import Session

    s = Session(model)
    rows = []
    for i in range(0, len(ids), CHUNK):
        rows.append(s.prefill(ids[i : i + CHUNK]).copy())
    fed: list[int] = []
    for j in range(steps):
        t = forced[j] if forced is not None else int(np.argmax(rows[-1]))
        fed.append(t)
        rows.append(s.step(t).copy())
    s.free()
    return np.array(rows), fed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--tokens", default="2048,8192")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--hf", action="store_true", help="also against HF transformers float32")
    a = ap.parse_args()

    from engine.gguf.aliases import resolve_model
    from engine.model.loader import load_model
    from engine.tokenizer import load_tokenizer

    path = resolve_model(a.model)
    model = load_model(path, resident=True, progress=False)
    tok = load_tokenizer(a.model)
    hf = None
    if a.hf:
        import torch
        import transformers

        hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                               dtype=torch.float32).eval()
    print(f"bench/kv_dtype.py: {a.model}, chunks of {CHUNK}, {a.steps} decode steps")
    for n in [int(x) for x in a.tokens.split(",")]:
        ids = _text_ids(tok, n)
        runs = {}
        for dt in ("f32", "f16", "bf16"):
            model.kv_dtype = dt
            forced = runs["f32"][1] if "f32" in runs else None
            runs[dt] = _run(model, ids, forced, a.steps)
            free = _run(model, ids, None, a.steps)[1] if dt != "f32" else runs[dt][1]
            runs[dt] = (*runs[dt], free)
        ref = runs["f32"][0]
        hf_rows = None
        if hf is not None:
            import torch

            full = ids + runs["f32"][1]
            with torch.no_grad():
                lg = hf(torch.tensor([full])).logits[0].float().numpy()
            ends = [min(i + CHUNK, n) - 1 for i in range(0, n, CHUNK)] + [n + j for j in range(a.steps)]
            hf_rows = lg[ends]
        print(f"\n{n} tokens")
        for dt in ("f32", "f16", "bf16"):
            rows, _, free = runs[dt]
            d = np.abs(rows - ref).max(-1)
            flips = int((rows.argmax(-1) != ref.argmax(-1)).sum())
            same = sum(x == y for x, y in zip(free, runs["f32"][2], strict=False))
            line = (f"  {dt:4s} vs f32: max |dlogit| {d.max():.2e}, median {np.median(d):.2e}, argmax changed at "
                    f"{flips}/{len(d)} positions, free-running greedy {same}/{a.steps} tokens as f32")
            if hf_rows is not None:
                h = np.abs(rows - hf_rows).max(-1)
                line += f"; vs HF max {h.max():.2e}, median {np.median(h):.2e}"
            print(line)


if __name__ == "__main__":
    main()
