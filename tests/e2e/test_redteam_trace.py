"""The effects red-team corpus and the blind holdouts through `fak run --trace` (a user's way in): one trace of every case on the
default policy, replayed by the CLI, gives each call the verdict the kernel gives it in process, and every
destructive case is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fak.core.abi import ToolCall
from fak.core.kernel import Kernel
from fak.core.policy import coding_floor
from support import paths

CORPORA = [paths.SUPPORT / "redteam" / "effects.jsonl", *sorted((paths.SUPPORT / "redteam").glob("holdout-*.jsonl"))]
CWD = "/work/proj"


def test_corpus_through_fak_run_trace(tmp_path: Path) -> None:
    cases = [json.loads(x) for f in CORPORA for x in f.read_text(encoding="utf-8").splitlines() if x.strip()]
    cases = [e for e in cases if "macOS" not in e["why"]]
    calls = [{"tool": e["tool"], "args": e["args"], "meta": {"cwd": CWD, "home": "/home/dev"}} for e in cases]
    trace = tmp_path / "redteam.json"
    trace.write_text(json.dumps({"trace_id": "redteam", "calls": calls}), encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "commands.main", "run", "--trace", str(trace), "--json"],
                       capture_output=True, text=True, timeout=300, cwd=paths.REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(r.stdout)["calls"]
    assert len(rows) == len(cases)
    kernel = Kernel.with_policy(coding_floor())
    refused_destructive = 0
    for e, row in zip(cases, rows, strict=True):
        want = kernel.submit(ToolCall.from_args(e["tool"], e["args"], meta={"cwd": CWD, "home": "/home/dev"})).verdict
        assert row["verdict"] == want.kind.value and row["reason"] == want.reason.value, (e["id"], row, want)
        if e["expect"] != "allow" and row["verdict"] in ("DENY", "REQUIRE_WITNESS"):
            refused_destructive += 1
    destructive = sum(1 for e in cases if e["expect"] != "allow")
    assert refused_destructive == destructive, (refused_destructive, destructive)
