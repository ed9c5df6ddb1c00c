"""Tokenizer load and throughput for a GGUF vocabulary (default: Gemma 3 270M's 262k tokens).

    python bench/tokenizer.py [MODEL] [--gguf-reader]

Cold = no cache entry (read metadata, derive merges, build, write the cache); warm = a fresh
process-level load from the cache entry (what every later boot pays). Throughput figures use a
mixed text (code, whitespace runs, emoji, CJK, numbers) repeated to ~1 MB.
"""

from __future__ import annotations

import sys
import tempfile
import time

MIXED = (
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
    "\t\tTabs\tand    runs   of  spaces  \n"
    "Emoji: 😀👍🏽🇫🇷 ❤️‍🔥  CJK: 日本語のテキスト、中文字符，한국어 텍스트\n"
    "Numbers: 0 7 42 1234567890 3.14159 -2.5e-10 1,000,000\n"
    "The quick brown fox jumps over the lazy dog. Naïve café, Ünïcödé, русский, हिन्दी.\n"
)


def best_of(n: int, fn) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    name = args[0] if args else "gemma3-270m"
    import os

    import engine.tokenizer.tokenizer as T
    from engine.gguf.aliases import resolve_model
    from engine.tokenizer.build import assemble, plan_tokenizer
    from engine.tokenizer.vocab import read_vocab

    path = resolve_model(name)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["FAK_TOKENIZER_CACHE"] = cache
        t0 = time.perf_counter()
        tok = T.load_tokenizer(str(path))
        cold = time.perf_counter() - t0

        def warm_load() -> None:
            T.clear_memo()
            T.load_tokenizer(str(path)).encode("warm")

        returns = []
        for _ in range(3):
            T.clear_memo()
            t0 = time.perf_counter()
            pending = T.load_tokenizer(str(path))
            returns.append(time.perf_counter() - t0)
            pending._get()
        warm = best_of(3, warm_load)
        t_meta = best_of(1, lambda: read_vocab(path))
        meta = read_vocab(path)
        t0 = time.perf_counter()
        plan = plan_tokenizer(meta)
        t_plan = time.perf_counter() - t0
        t_asm = best_of(1, lambda: assemble(plan, meta.tokens))
        size = sum(os.path.getsize(os.path.join(cache, f)) for f in os.listdir(cache))

    print(f"vocabulary       {path.name}: {tok.info.model}/{tok.info.pre}, {tok.vocab_size} tokens, "
          f"{len(plan.merges)} merges")
    print(f"cold load        {cold:.2f} s  (metadata {t_meta:.2f} s, merges {t_plan:.2f} s, "
          f"build {t_asm:.2f} s, + cache write; cache entry {size / 2**20:.1f} MiB)")
    print(f"warm load        {min(returns):.3f} s to return (ids, flags, template ready; best of 3)")
    print(f"warm encode-ready {warm:.2f} s (load + first encode; vocabulary and BPE built in a background "
          f"thread from the cache entry; best of 3)")
    if "--gguf-reader" in sys.argv:
        from gguf import GGUFReader

        print(f"gguf.GGUFReader  {best_of(1, lambda: GGUFReader(path)):.2f} s  (open only, for comparison)")

    text = MIXED * (1_000_000 // len(MIXED.encode("utf-8")) + 1)
    mb = len(text.encode("utf-8")) / 1e6
    t_enc = best_of(3, lambda: tok.encode(text))
    ids = tok.encode(text)
    t_dec = best_of(3, lambda: tok.decode(ids))

    def stream_all() -> None:
        s = tok.stream()
        for i in ids:
            s.push(i)
        s.flush()

    t_stream = best_of(3, stream_all)
    line = MIXED.splitlines()[5]
    n_small = 2000
    t_small = best_of(3, lambda: [tok.encode(line) for _ in range(n_small)])
    print(f"encode           {mb / t_enc:.2f} MB/s  ({mb:.2f} MB -> {len(ids)} tokens in {t_enc:.2f} s)")
    print(f"encode (short)   {n_small / t_small:.0f} calls/s  ({len(line)} chars each)")
    print(f"decode           {mb / t_dec:.2f} MB/s")
    print(f"stream           {len(ids) / t_stream / 1e6:.2f} M tokens/s  ({t_stream / len(ids) * 1e6:.2f} us/token)")


if __name__ == "__main__":
    main()
