"""Scheduler flags on `fak run --trace ... --engine inkernel` (flag, else FAK_* variable, else default)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fak.boot import SchedOptions
from fak.errors import FakError

REPO = Path(__file__).resolve().parents[1]


def _fak(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAK_")} | extra_env
    return subprocess.run([sys.executable, "-m", "commands.main", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env)


def test_flags_reach_the_engine_and_bad_values_are_one_line() -> None:
    ok = _fak("run", "--trace", "examples/trace.json", "--engine", "inkernel", "--max-running", "2",
              "--kv-blocks", "64", "--block-tokens", "8", "--preempt", "recompute", "--victim", "cost-aware", "--json")
    assert ok.returncode == 0, ok.stderr
    assert all(c["status"] == "OK" for c in json.loads(ok.stdout)["calls"] if c["verdict"] != "DENY")
    bad = _fak("run", "--trace", "examples/trace.json", "--engine", "inkernel", "--preempt", "drop")
    assert bad.returncode == 2 and bad.stderr.strip() == "fak: error: --preempt 'drop': expected one of swap, recompute"


def test_sched_options_flag_beats_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("FAK_MAX_RUNNING", "FAK_KV_BLOCKS", "FAK_BLOCK_TOKENS", "FAK_PREEMPT", "FAK_VICTIM"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FAK_BLOCK_TOKENS", "32")
    monkeypatch.setenv("FAK_VICTIM", "cost-aware")
    o = SchedOptions.resolve(max_running=0, kv_blocks=None, block_tokens=8, preempt="swap", victim=None)
    assert (o.max_running, o.block_tokens, o.kv_blocks, o.preempt, o.victim) == (0, 8, None, "swap", "cost-aware")
    assert SchedOptions.resolve(env=False).block_tokens == 16  # env=False: flags and defaults only
    with pytest.raises(FakError, match="--kv-blocks 0: expected a positive integer"):
        SchedOptions.resolve(kv_blocks=0)
    monkeypatch.setenv("FAK_KV_BLOCKS", "x")
    with pytest.raises(FakError, match="FAK_KV_BLOCKS='x' is not a valid int"):
        SchedOptions.resolve()


def test_small_budget_with_recompute_serves_every_call() -> None:
    r = _fak("run", "--trace", "examples/trace.json", "--engine", "inkernel", "--max-running", "2", "--kv-blocks", "8",
             "--preempt", "recompute", "--json")
    assert r.returncode == 0, r.stderr
    calls = json.loads(r.stdout)["calls"]
    assert [c["status"] for c in calls if c["verdict"] != "DENY"] == ["OK"] * 6


@pytest.mark.parametrize("args, env, needle", [
    (["--block-tokens", "99999999999999999999999"], {}, "KV pool of 8 blocks x 99999999999999999999999 tokens needs"),
    (["--kv-blocks", "99999999999999999999"], {}, "KV pool of 99999999999999999999 blocks x 16 tokens needs"),
    ([], {"FAK_PREEMPT": "zzz"}, "preempt 'zzz' (or $FAK_PREEMPT): expected one of swap, recompute"),
    ([], {"FAK_MAX_RUNNING": "-1"}, "max_running -1 (or $FAK_MAX_RUNNING): expected a non-negative integer"),
])
def test_impossible_scheduler_settings_fail_at_boot(args: list[str], env: dict[str, str], needle: str) -> None:
    """Not a table of ERROR rows and exit 0: one line, exit 2, before any call."""
    r = _fak("run", "--trace", "examples/trace.json", "--engine", "inkernel", *args, **env)
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr.startswith("fak: error: inkernel: ") and needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
