"""Load time and RSS for a GGUF model, plain (float32) or resident (--q4k); one prefill and a few steps.

    python bench/load.py [MODEL] [--q4k]   (default gemma3-270m)
"""

from __future__ import annotations

import argparse
import sys
import time

import psutil


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default="gemma3-270m", help="GGUF path or alias")
    ap.add_argument("--q4k", action="store_true", help="resident quantized blocks instead of float32")
    a = ap.parse_args()
    name = a.model
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    t0 = time.perf_counter()
    from engine import Session, load_model
    from engine.errors import EngineError
    from engine.gguf.aliases import resolve_model
    from engine.gguf.reader import read_gguf

    try:
        path = resolve_model(name)
    except EngineError as exc:
        sys.exit(f"bench/load.py: error: {exc}")
    t1 = time.perf_counter()
    read_gguf(path)
    t_header = time.perf_counter() - t1
    t2 = time.perf_counter()
    model = load_model(str(path), resident=a.q4k, progress=False)
    t_load = time.perf_counter() - t2
    rss1 = proc.memory_info().rss
    print(f"model            {path.name} ({path.stat().st_size / 2**20:.0f} MiB file)")
    print(f"import engine    {t1 - t0:.2f} s")
    print(f"read header      {t_header:.2f} s")
    kind = "resident load" if a.q4k else "plain load   "
    print(f"{kind}    {t_load:.2f} s  ({model.weights.nbytes / 2**20:.0f} MiB of weights)")
    print(f"RSS              {rss1 / 2**20:.0f} MiB (+{(rss1 - rss0) / 2**20:.0f} MiB)")
    s = Session(model)
    ids = [2] + [(i * 7919) % 20000 + 100 for i in range(63)]
    s.prefill(ids[:4])  # warm the kernels (numba cache load)
    s.step(5)
    s = Session(model)
    t3 = time.perf_counter()
    logits = s.prefill(ids)
    t_pre = time.perf_counter() - t3
    n = 16
    t4 = time.perf_counter()
    for _ in range(n):
        logits = s.step(int(logits.argmax()))
    t_dec = time.perf_counter() - t4
    print(f"prefill 64 tok   {t_pre:.2f} s  ({64 / t_pre:.1f} tok/s)")
    print(f"decode {n} tok    {t_dec:.2f} s  ({n / t_dec:.1f} tok/s)")
    print(f"peak RSS         {proc.memory_info().rss / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
