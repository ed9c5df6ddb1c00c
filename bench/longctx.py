"""Agent-sized prompts: `fak serve` vs llama.cpp's `llama-server` on the same GGUF, one stream, one run.

    python bench/longctx.py [--model qwen2.5-coder-0.5b] [--sizes 2048,8192,16384] [--new 64]
                            [--llama-server PATH | --build-llama | --no-llama] [--restart] [--json PATH]

For each size N (fresh text for each, the same token ids to both servers, on /v1/completions as an id
list, greedy, streamed):
  cold      a prompt of N tokens neither server has seen: TTFT, cold prefill tok/s = N / TTFT;
  decode    tok/s of the reply that follows (`--new` tokens, first to last);
  next turn the same prompt + that reply + ~150 new tokens (an agent's next request): TTFT;
  RSS       each server's resident memory after the size.
With --restart, fak serve is stopped and started again on the same --kv-cache-dir after the sizes, and
the largest prompt is sent again: TTFT after the restart against its cold prefill, and whether the
greedy tokens are the ones the first process gave.

llama-server: --llama-server PATH, else `llama-server` on PATH, else the one --build-llama builds from the
llama.cpp sources vendored in the llama-cpp-python sdist (pip download; cmake; ~15 min on 2 cores; a
bench-only step, kept under ~/.cache/fak/llama.cpp). It runs with -np 1, -t <cores>, its defaults
otherwise (f16 KV cache, flash attention auto, prompt cache on). The servers run one at a time, so each
has the machine to itself.

--json PATH also writes the figures there as JSON (bench/report.py draws them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # this checkout's engine/, then support.serve_helpers
LLAMA_HOME = Path.home() / ".cache" / "fak" / "llama.cpp"


@dataclass
class Turn:
    ttft: float
    tokens: list[str]
    decode_tps: float


@dataclass
class Row:
    size: int
    cold: Turn | None = None
    next_ttft: float = float("nan")
    rss_mb: float = float("nan")
    extra: dict[str, float] = field(default_factory=dict)


def corpus_ids(tokenize: object, n: int, salt: int) -> list[int]:
    """n token ids of real code (this repository's Python files, a different starting file per salt)."""
    files = sorted(ROOT.glob("engine/**/*.py")) + sorted(ROOT.glob("fak/**/*.py"))
    files = files[salt % len(files):] + files[: salt % len(files)]
    ids: list[int] = []
    for f in files:
        ids += tokenize(f"# file: {f.relative_to(ROOT)} (#{salt})\n" + f.read_text())  # type: ignore[operator]
        if len(ids) >= n:
            return ids[:n]
    raise SystemExit(f"bench/longctx.py: not enough text for {n} tokens")


def stream(url: str, model: str, ids: list[int], new: int) -> Turn:
    body = {"model": model, "prompt": ids, "max_tokens": new, "temperature": 0, "stream": True, "seed": 0}
    t0 = time.perf_counter()
    stamps: list[float] = []
    toks: list[str] = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=3600) as r:
        if r.status_code != 200:
            raise SystemExit(f"bench/longctx.py: {url}: HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            ch = ev.get("choices") or []
            if ch and ch[0].get("text"):
                stamps.append(time.perf_counter())
                toks.append(ch[0]["text"])
    if not stamps:
        raise SystemExit(f"bench/longctx.py: {url}: no tokens streamed")
    tps = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 2 else float("nan")
    return Turn(stamps[0] - t0, toks, tps)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class Llama:
    def __init__(self, binary: str, gguf: str, ctx: int, parallel: int = 1) -> None:
        # ctx is llama-server's whole KV cache, split evenly between its `parallel` slots
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(self.port), "-np", str(parallel),
                                      "-c", str(ctx), "-t", str(os.cpu_count() or 1)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                raise SystemExit(f"bench/longctx.py: llama-server exited ({self.proc.returncode})")
            time.sleep(0.5)
        raise SystemExit("bench/longctx.py: llama-server did not become healthy")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def find_llama(given: str | None, build: bool) -> str | None:
    if given:
        return given
    for cand in (shutil.which("llama-server"), str(LLAMA_HOME / "build" / "bin" / "llama-server")):
        if cand and Path(cand).exists():
            return cand
    return build_llama() if build else None


def build_llama() -> str:
    """llama.cpp's server from the llama-cpp-python sdist's vendored sources (bench-only)."""
    LLAMA_HOME.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "llama-cpp-python", "-d", d], check=True)
        sdist = next(Path(d).glob("llama_cpp_python-*.tar.gz"))
        subprocess.run(["tar", "xzf", str(sdist), "-C", d], check=True)
        src = next(Path(d).glob("llama_cpp_python-*/vendor/llama.cpp"))
        shutil.rmtree(LLAMA_HOME, ignore_errors=True)
        shutil.copytree(src, LLAMA_HOME)
    subprocess.run(["cmake", "-B", "build", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=ON",
                    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"], cwd=LLAMA_HOME, check=True)
    subprocess.run(["cmake", "--build", "build", "--target", "llama-server", f"-j{os.cpu_count() or 1}"],
                   cwd=LLAMA_HOME, check=True)
    return str(LLAMA_HOME / "build" / "bin" / "llama-server")


def run_sizes(url: str, model: str, pid: int, prompts: dict[int, list[int]], follow: dict[int, list[int]],
              new: int, who: str) -> dict[int, Row]:
    out: dict[int, Row] = {}
    for n, ids in prompts.items():
        row = Row(n)
        row.cold = stream(url, model, ids, new)
        nxt = ids + tok_ids_of(row.cold) + follow[n]
        row.next_ttft = stream(url, model, nxt, 8).ttft
        row.rss_mb = rss_mb(pid)
        out[n] = row
        print(f"  {who:5s} {n:6d} tokens: cold TTFT {row.cold.ttft:7.2f} s ({n / row.cold.ttft:6.1f} tok/s), "
              f"decode {row.cold.decode_tps:5.1f} tok/s, next turn TTFT {row.next_ttft:6.2f} s, "
              f"RSS {row.rss_mb:,.0f} MB", flush=True)
    return out


_TOKENIZE: list[object] = []


def tok_ids_of(turn: Turn) -> list[int]:
    """The reply's text as ids (the next request carries it back, as an agent's history does)."""
    return _TOKENIZE[0]("".join(turn.tokens))  # type: ignore[operator]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--sizes", default="2048,8192,16384")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--llama-server", default=None)
    ap.add_argument("--build-llama", action="store_true")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--restart", action="store_true", help="restart fak serve and resend the largest prompt")
    ap.add_argument("--fak-args", default="", help="extra fak serve flags (space-separated)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    a = ap.parse_args()
    from engine.errors import EngineError
    from engine.gguf.aliases import resolve_model
    from engine.tokenizer.tokenizer import load_tokenizer

    try:
        gguf = str(resolve_model(a.model))
    except EngineError as e:
        raise SystemExit(f"bench/longctx.py: --model {a.model}: {e}") from None
    tok = load_tokenizer(gguf)
    _TOKENIZE.append(lambda text: tok.encode(text, add_special=False))
    sizes = [int(s) for s in a.sizes.split(",")]
    prompts = {n: corpus_ids(_TOKENIZE[0], n, salt=i * 7 + 1) for i, n in enumerate(sizes)}
    follow = {n: corpus_ids(_TOKENIZE[0], 150, salt=1000 + i) for i, n in enumerate(sizes)}
    llama = None if a.no_llama else find_llama(a.llama_server, a.build_llama)
    print(f"bench/longctx.py: {a.model} ({gguf}), sizes {sizes}, {a.new} new tokens, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")

    from support.serve_helpers import Server

    cache = tempfile.mkdtemp(prefix="fak-kv-bench-")
    fargs = ("--gguf", a.model, "--kv-cache-dir", cache, *a.fak_args.split())
    fak = Server(*fargs, boot_timeout=600)
    try:
        fak_rows = run_sizes(fak.url, a.model, fak.proc.pid, prompts, follow, a.new, "fak")
    finally:
        fak.stop()
    restart: tuple[float, bool] | None = None
    if a.restart:
        n = sizes[-1]
        fak = Server(*fargs, boot_timeout=600)
        try:
            again = stream(fak.url, a.model, prompts[n], a.new)
            restart = (again.ttft, again.tokens == fak_rows[n].cold.tokens)  # type: ignore[union-attr]
        finally:
            fak.stop()
    shutil.rmtree(cache, ignore_errors=True)
    llama_rows: dict[int, Row] = {}
    if llama:
        srv = Llama(llama, gguf, max(sizes) * 2 + 2048)
        try:
            llama_rows = run_sizes(srv.url, a.model, srv.proc.pid, prompts, follow, a.new, "llama")
        finally:
            srv.stop()
    else:
        print("  (no llama-server: --llama-server PATH or --build-llama for the side-by-side figures)")

    print(f"\n{'tokens':>7s} | {'cold prefill tok/s fak / llama':>31s} | {'next-turn TTFT s fak / llama':>29s} | "
          f"{'decode tok/s fak / llama':>25s} | {'RSS MB fak / llama':>19s}")
    for n in sizes:
        f, l_ = fak_rows[n], llama_rows.get(n)
        fc = n / f.cold.ttft  # type: ignore[union-attr]
        if l_ is not None:
            lc = n / l_.cold.ttft  # type: ignore[union-attr]
            print(f"{n:7d} | {fc:8.1f} / {lc:6.1f} ({fc / lc:5.2f}x)      | {f.next_ttft:6.2f} / {l_.next_ttft:6.2f} "
                  f"({l_.next_ttft / f.next_ttft:5.2f}x)  | {f.cold.decode_tps:5.1f} / {l_.cold.decode_tps:5.1f} "  # type: ignore[union-attr]
                  f"({f.cold.decode_tps / l_.cold.decode_tps:4.2f}x) | {f.rss_mb:7,.0f} / {l_.rss_mb:7,.0f}")  # type: ignore[union-attr]
        else:
            print(f"{n:7d} | {fc:8.1f}                       | {f.next_ttft:6.2f}                      | "
                  f"{f.cold.decode_tps:5.1f}                   | {f.rss_mb:7,.0f}")  # type: ignore[union-attr]
    if restart is not None:
        n = sizes[-1]
        cold = fak_rows[n].cold.ttft  # type: ignore[union-attr]
        print(f"\nafter a restart of fak serve, the {n}-token prompt: TTFT {restart[0]:.2f} s = "
              f"{restart[0] / cold:.1%} of its cold prefill ({cold:.1f} s); greedy tokens "
              f"{'equal' if restart[1] else 'DIFFERENT'} to the first process's")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "bench": "longctx", "model": a.model, "sizes": sizes, "new": a.new, "llama_server": llama,
            "fak": {str(n): row_json(r) for n, r in fak_rows.items()},
            "llama": {str(n): row_json(r) for n, r in llama_rows.items()} if llama else None,
            "restart": {"ttft": restart[0], "same_tokens": restart[1]} if restart is not None else None,
        }, indent=1))


def row_json(r: Row) -> dict[str, float]:
    assert r.cold is not None
    return {"cold_ttft_s": r.cold.ttft, "cold_prefill_tps": r.size / r.cold.ttft, "decode_tps": r.cold.decode_tps,
            "next_ttft_s": r.next_ttft, "rss_mb": r.rss_mb}


if __name__ == "__main__":
    main()
