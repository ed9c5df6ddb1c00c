"""`fak serve` under N concurrent streaming clients, beside the scheduler driven directly.

    python bench/serve.py [--model gemma3-270m] [--levels 1,4,16,64] [--prompt 8] [--new 128]
                          [--url URL] [--peer URL] [--json PATH]

For each level c: c clients each stream one greedy completion of `--new` tokens (ignore_eos is not
on the wire, so prompts are chosen to run long and tokens are counted as received) at the same
moment. Prints aggregate tok/s (tokens received / wall), TTFT p50/p99 and inter-token latency p50/p99
per client stream. Without --url a `fak serve` is started on 127.0.0.1 (a free port) and stopped at
the end; `--peer URL` runs the same load against another OpenAI-compatible server on the same GGUF,
alternated level by level, and prints the ratio. The scheduler's own figure for the same c is
`python bench/sched.py --levels c --prompt 8 --new 128` (its "scheduler tok/s"). --json PATH also writes
the figures there as JSON (bench/report.py draws them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


async def one(client: httpx.AsyncClient, url: str, model: str, prompt: str, new: int) -> tuple[int, float, list[float]]:
    body = {"model": model, "prompt": prompt, "max_tokens": new, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    stamps: list[float] = []
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("choices") and ev["choices"][0].get("text"):
                stamps.append(time.perf_counter())
    ttft = stamps[0] - t0 if stamps else float("nan")
    itl = list(np.diff(stamps)) if len(stamps) > 1 else []
    return len(stamps), ttft, itl


async def level(url: str, model: str, c: int, new: int) -> tuple[float, list[float], list[float]]:
    prompts = [f"Chapter {i + 1}. Once upon a time, in a land far away," for i in range(c)]
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=c + 4)) as client:
        t0 = time.perf_counter()
        out = await asyncio.gather(*(one(client, url, model, p, new) for p in prompts))
        wall = time.perf_counter() - t0
    tokens = sum(n for n, _, _ in out)
    return tokens / wall, [t for _, t, _ in out], [x for _, _, i in out for x in i]


def level_json(tps: float, ttft: list[float], itl: list[float]) -> dict[str, float]:
    return {"tps": tps, "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
            "itl_p50_s": pct(itl, 50), "itl_p99_s": pct(itl, 99)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--levels", default="1,4,16,64")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--url", help="a running fak serve (default: start one)")
    ap.add_argument("--peer", help="another OpenAI-compatible server on the same GGUF")
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    a = ap.parse_args()
    rows: list[dict[str, object]] = []
    server = None
    url = a.url
    if url is None:
        from support.serve_helpers import Server

        server = Server("--gguf", a.model)
        url = server.url
    try:
        asyncio.run(level(url, a.model, 2, 4))  # first touch
        print(f"{'c':>3} | {'tok/s':>8} {'TTFT p50':>9} {'p99':>7} {'ITL p50':>8} {'p99':>7}" +
              (" | peer tok/s TTFT p50 ITL p50  p99 | ratio" if a.peer else ""))
        for c in [int(x) for x in a.levels.split(",")]:
            tps, ttft, itl = asyncio.run(level(url, a.model, c, a.new))
            row = (f"{c:>3} | {tps:>8.1f} {pct(ttft, 50):>8.3f}s {pct(ttft, 99):>6.3f}s "
                   f"{1e3 * pct(itl, 50):>6.1f}ms {1e3 * pct(itl, 99):>5.1f}ms")
            if a.peer:
                ptps, pttft, pitl = asyncio.run(level(a.peer, a.model, c, a.new))
                row += (f" | {ptps:>10.1f} {pct(pttft, 50):>7.3f}s {1e3 * pct(pitl, 50):>5.1f}ms "
                        f"{1e3 * pct(pitl, 99):>5.1f}ms | {tps / ptps:>5.2f}x")
            print(row, flush=True)
            rows.append({"streams": c, "fak": level_json(tps, ttft, itl),
                         "peer": level_json(ptps, pttft, pitl) if a.peer else None})
        if a.json:
            Path(a.json).write_text(json.dumps({"bench": "serve", "model": a.model, "new": a.new, "peer": a.peer,
                                                "levels": rows}, indent=1))
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
