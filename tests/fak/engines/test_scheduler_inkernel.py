"""The inkernel engine admits through the scheduler: streaming pieces, concurrent calls, cancel, env options."""

from __future__ import annotations

import pytest

from fak.core.abi import LifecycleEngine, ToolCall
from fak.engines import get_engine
from fak.errors import FakError


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("FAK_MODEL", "FAK_MODEL_DIR", "FAK_MAX_RUNNING", "FAK_KV_BLOCKS", "FAK_BLOCK_TOKENS",
                "FAK_PREEMPT", "FAK_VICTIM"):
        monkeypatch.delenv(var, raising=False)


def test_admit_streams_and_complete_drains_the_same_output() -> None:
    e = get_engine("inkernel", max_tokens=12, max_running=2)
    assert isinstance(e, LifecycleEngine)
    calls = [ToolCall.from_args("search", {"prompt": f"query number {i}"}) for i in range(5)]
    reqs = [e.admit(c) for c in calls]
    streamed = ["".join(r.tokens()) for r in reqs]
    results = [r.result() for r in reqs]
    for c, s, r in zip(calls, streamed, results, strict=False):
        assert r.ok and r.meta["finish_reason"] == "length" and r.meta["output_tokens"] == 12
        assert s == r.payload["generated_text"]
        assert e.complete(c).payload == r.payload  # one-shot path: same greedy output
    assert e.scheduler().stats().max_running_observed <= 2
    e.close()


def test_cancel_through_the_engine() -> None:
    e = get_engine("inkernel", max_tokens=2000, prompt_tokens=8)
    req = e.admit(ToolCall.from_args("t", {"prompt": "abcdefgh"}))
    it = req.tokens()
    next(it)
    req.cancel()
    r = req.result()
    assert r.ok and r.meta["finish_reason"] == "cancelled" and r.meta["output_tokens"] < 2000
    assert e.scheduler().pool.num_used == e.scheduler().stats().cached_blocks
    e.close()


def test_env_options_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAK_MAX_RUNNING", "3")
    monkeypatch.setenv("FAK_KV_BLOCKS", "64")
    monkeypatch.setenv("FAK_PREEMPT", "recompute")
    monkeypatch.setenv("FAK_VICTIM", "cost-aware")
    e = get_engine("inkernel", block_tokens=8)
    assert e.caps()["scheduler"] == {"max_running": 3, "kv_blocks": 64, "block_tokens": 8,
                                     "preempt": "recompute", "victim": "cost-aware"}
    s = e.scheduler()
    assert (s.max_running, s.kv_blocks, s.pool.block_tokens, s.preempt_mode, s.victim_rule) == (
        3, 64, 8, "recompute", "cost-aware")
    e.close()
    monkeypatch.setenv("FAK_KV_BLOCKS", "lots")
    with pytest.raises(FakError, match="FAK_KV_BLOCKS='lots' is not a valid int"):
        get_engine("inkernel")


@pytest.mark.parametrize("env, value, needle", [
    ("FAK_VICTIM", "random", "victim 'random' (or $FAK_VICTIM): expected one of most-recent, cost-aware"),
    ("FAK_PREEMPT", "zzz", "preempt 'zzz' (or $FAK_PREEMPT): expected one of swap, recompute"),
    ("FAK_MAX_RUNNING", "-4", "max_running -4 (or $FAK_MAX_RUNNING): expected a non-negative integer"),
    ("FAK_BLOCK_TOKENS", "0", "block_tokens 0 (or $FAK_BLOCK_TOKENS): expected a positive integer"),
    ("FAK_KV_BLOCKS", "0", "kv_blocks 0 (or $FAK_KV_BLOCKS): expected a positive integer"),
])
def test_bad_scheduler_option_fails_at_construction(monkeypatch: pytest.MonkeyPatch, env: str, value: str,
                                                   needle: str) -> None:
    """A bad option is a boot error, not an ERROR result on every call (exit 0 with a table of failures)."""
    monkeypatch.setenv(env, value)
    with pytest.raises(FakError) as exc:
        get_engine("inkernel")
    assert needle in str(exc.value)


def test_bad_scheduler_option_argument_fails_at_construction() -> None:
    with pytest.raises(FakError, match="victim 'random'"):
        get_engine("inkernel", victim="random")


def test_prompt_over_the_kv_budget_is_an_error_result() -> None:
    e2 = get_engine("inkernel", kv_blocks=2, block_tokens=4, prompt_tokens=64)
    r2 = e2.complete(ToolCall.from_args("t", {"prompt": "y" * 40}))
    assert not r2.ok and "the budget is 2" in r2.payload["error"]
    e2.close()
