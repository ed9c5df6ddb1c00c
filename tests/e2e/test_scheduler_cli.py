"""Scheduler flags on `fak run --trace ... --engine inkernel` (flag, else FAK_* variable, else default)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fak.errors import FakError
from fak.runtime.boot import SchedOptions
from support import paths

REPO = paths.REPO


def _fak(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAK_")} | extra_env
    return subprocess.run([sys.executable, "-m", "commands.main", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env)


@pytest.mark.slow
def test_flags_reach_the_engine_and_bad_values_are_one_line() -> None:
    ok = _fak("run", "--trace", "examples/trace.json", "--engine", "inkernel", "--max-running", "2",
              "--kv-blocks", "64", "--block-tokens", "8", "--preempt", "recompute", "--victim", "cost-aware", "--json")
    assert ok.returncode == 0, ok.stderr
    assert all(c["status"] == "OK" for c in json.loads(ok.stdout)["calls"] if c["verdict"] != "DENY")
    bad = _fak("run", "--trace", "examples/trace.json", "--engine", "inkernel", "--preempt", "drop")
    assert bad.returncode == 2 and bad.stderr.strip() == "fak: error: --preempt 'drop': expected one of swap, recompute"
    bad = _fak("run", "synthetic", "--ids", "1,2", "--kv-dtype", "f8")
    assert bad.returncode == 2 and bad.stderr.strip() == "fak: error: --kv-dtype 'f8': expected one of f32, f16, bf16"


@pytest.mark.parametrize("args, env, want", [
    (["run", "--trace", "examples/trace.json", "--engine", "inkernel", "--max-running", "2", "--kv-blocks", "64",
      "--block-tokens", "8", "--preempt", "recompute", "--victim", "cost-aware", "--kv-dtype", "bf16", "--json"], {},
     (2, 64, 8, "recompute", "cost-aware", "bf16")),
    (["run", "--trace", "examples/trace.json", "--engine", "inkernel", "--max-running", "3", "--json"],
     {"FAK_KV_BLOCKS": "40", "FAK_BLOCK_TOKENS": "4", "FAK_PREEMPT": "recompute", "FAK_VICTIM": "cost-aware",
      "FAK_KV_DTYPE": "f16"},
     (3, 40, 4, "recompute", "cost-aware", "f16")),
    (["run", "synthetic", "--ids", "1,2,3", "--max-tokens", "4", "--max-running", "1", "--kv-blocks", "9",
      "--block-tokens", "4", "--preempt", "recompute", "--victim", "cost-aware", "--kv-dtype", "f32", "--json"],
     {"FAK_PREEMPT": "swap", "FAK_KV_DTYPE": "bf16"},
     (1, 9, 4, "recompute", "cost-aware", "f32")),
    (["run", "synthetic", "--ids", "1,2,3", "--max-tokens", "4", "--json"], {},
     (0, None, 16, "swap", "most-recent", SchedOptions.kv_dtype)),
], ids=["trace-flags", "trace-env", "model-flags", "model-defaults"])
def test_the_scheduler_is_built_with_the_flags(args: list[str], env: dict[str, str], want: tuple,
                                               monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """In process, so the scheduler the CLI built can be inspected: its policy, its pool, what it ran."""
    import engine.sched.scheduler as S
    from commands.main import main

    built: list[S.NativeScheduler] = []

    class Recording(S.NativeScheduler):
        def __init__(self, *a: object, **kw: object) -> None:
            super().__init__(*a, **kw)  # type: ignore[arg-type]
            built.append(self)

    monkeypatch.setattr(S, "NativeScheduler", Recording)
    for var in SchedOptions.ENV.values():
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", ["fak", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 0, capsys.readouterr().err
    [sched] = built
    got = (sched.max_running, sched.kv_blocks, sched.pool.block_tokens, sched.preempt_mode, sched.victim_rule,
           sched.pool.kv_dtype)
    assert got == want
    st = sched.stats()  # published by the loop as it stopped
    assert (st.max_running, st.max_blocks, st.preempt_mode, st.victim_rule) == (want[0], want[1], want[3], want[4])
    assert st.finished.get("length", 0) >= 1 and (want[0] == 0 or st.max_running_observed <= want[0])
    assert sched.pool.growable == (want[1] is None) and (want[1] is None or sched.pool.capacity == want[1])
    json.loads(capsys.readouterr().out)


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


@pytest.mark.slow
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
    ([], {"FAK_KV_DTYPE": "half"}, "kv_dtype 'half' (or $FAK_KV_DTYPE): expected one of f32, f16, bf16"),
])
def test_impossible_scheduler_settings_fail_at_boot(args: list[str], env: dict[str, str], needle: str) -> None:
    """Not a table of ERROR rows and exit 0: one line, exit 2, before any call."""
    r = _fak("run", "--trace", "examples/trace.json", "--engine", "inkernel", *args, **env)
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr.startswith("fak: error: inkernel: ") and needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
