"""The real Claude Code under `fak guard --gguf MODEL`: how long its requests' prefills take, and how much
of each later request the prefix cache (memory, then disk) serves.

    python bench/guard_claude.py [--model qwen2.5-coder-0.5b] [--runs 2] [--prompt TEXT]

Each run starts a fresh `fak guard --gguf MODEL --sandbox off -- <poller> -- claude -p PROMPT` with its
own HOME; the runs share one --kv-cache-dir (FAK_KV_CACHE_DIR), so run 2 is "the same agent tomorrow". The
poller (this file, --poll) reads the gateway's /fak/stats every 0.2 s while Claude Code runs and splits the
series into requests: each stretch where prefill_tokens grows is one prefill. Printed per request: prompt
tokens prefilled, tokens mapped from the prefix cache, blocks read from disk, and the prefill's wall time.
Needs the npm agents (npm ci --prefix tests/agents).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def poll(out: str, argv: list[str]) -> int:
    """Run argv (Claude Code) while sampling $ANTHROPIC_BASE_URL/fak/stats into `out` (JSON lines)."""
    import httpx

    url = os.environ["ANTHROPIC_BASE_URL"].rstrip("/") + "/fak/stats"
    done = threading.Event()

    def sample() -> None:
        with open(out, "w") as f:
            while not done.is_set():
                try:
                    s = httpx.get(url, timeout=5).json().get("sched") or {}
                    f.write(json.dumps({"t": time.monotonic(), **{k: s.get(k, 0) for k in (
                        "prefill_tokens", "prefix_hit_tokens", "kv_disk_hits", "admitted", "running")}}) + "\n")
                    f.flush()
                except (httpx.HTTPError, ValueError):
                    pass
                done.wait(0.2)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    rc = subprocess.run(argv).returncode
    time.sleep(0.5)
    done.set()
    th.join()
    return rc


def requests(series: list[dict[str, float]]) -> list[dict[str, float]]:
    """Per request (a new `admitted` count starts one): its prompt tokens prefilled, mapped from the prefix
    cache and from disk, and the seconds from its admission to the sample where its prefill was done."""
    out: list[dict[str, float]] = []
    for prev, s in zip(series, series[1:], strict=False):
        if s["admitted"] > prev["admitted"]:
            out.append({"t0": prev["t"], "p0": prev["prefill_tokens"], "h0": prev["prefix_hit_tokens"],
                        "k0": prev["kv_disk_hits"], "done": s["t"]})
        if out:
            cur = out[-1]
            if s["prefill_tokens"] > cur.get("p1", cur["p0"]):
                cur["done"] = s["t"]
            cur["p1"], cur["h1"], cur["k1"] = s["prefill_tokens"], s["prefix_hit_tokens"], s["kv_disk_hits"]
    return [{"tokens": r.get("p1", r["p0"]) - r["p0"], "hit": r.get("h1", r["h0"]) - r["h0"],
             "disk": r.get("k1", r["k0"]) - r["k0"], "seconds": r["done"] - r["t0"]} for r in out]


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--poll":
        raise SystemExit(poll(sys.argv[2], sys.argv[sys.argv.index("--") + 1:]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--prompt", default="Run the shell command `ls -la` with the Bash tool and tell me what it printed.")
    ap.add_argument("--kv-cache-dir", default=None, help="default: a fresh temporary directory")
    a = ap.parse_args()
    from agents.run import agent_env, claude_argv

    if not Path(claude_argv("x")[0]).exists():
        raise SystemExit("bench/guard_claude.py: Claude Code is not installed (npm ci --prefix tests/agents)")
    kv = a.kv_cache_dir or tempfile.mkdtemp(prefix="fak-kv-claude-")
    print(f"bench/guard_claude.py: Claude Code under fak guard --gguf {a.model}, KV on disk in {kv}")
    for run in range(1, a.runs + 1):
        # the same paths every run: Claude Code's system prompt names its working directory, so another
        # path would be another prompt from the first lines on; and one HOME for all runs, as a user has
        # (Claude Code keeps its device id there, and the KV scope is the device: another HOME is another user)
        base = Path(tempfile.gettempdir()) / "fak-claude-bench"
        if run == 1:
            shutil.rmtree(base, ignore_errors=True)
        work, home = base / "work", base / "home"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        env = agent_env(home, FAK_KV_CACHE_DIR=kv, PYTHONPATH=str(ROOT))
        series = base / "stats.jsonl"
        argv = [sys.executable, "-m", "commands.main", "guard", "--gguf", a.model, "--sandbox", "off", "--no-journal",
                "--quiet", "--", sys.executable, __file__, "--poll", str(series), "--",
                *claude_argv(a.prompt)]
        t0 = time.perf_counter()
        r = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True, timeout=3600)
        wall = time.perf_counter() - t0
        rows = [json.loads(x) for x in series.read_text().splitlines()] if series.exists() else []
        print(f"\nrun {run}: exit {r.returncode}, {wall:.0f} s wall, {len(rows)} samples")
        if r.returncode != 0:
            print(r.stderr[-2000:])
        for i, p in enumerate(requests(rows), 1):
            print(f"  request {i}: prefilled {p['tokens']:6.0f} tokens, {p['hit']:6.0f} mapped from the prefix cache "
                  f"({p['disk']:.0f} blocks read from disk); admitted to prefill done {p['seconds']:6.1f} s")


if __name__ == "__main__":
    main()
