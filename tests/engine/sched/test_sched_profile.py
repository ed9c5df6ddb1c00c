"""The scheduler's per-phase profile (engine/sched/profile.py): off by default, on by flag or env."""

from __future__ import annotations

import pytest

from engine import synthetic_model
from engine.sched.lane import Request
from engine.sched.profile import PHASES
from engine.sched.scheduler import NativeScheduler


def test_profile_counts_every_iteration_by_phase() -> None:
    sched = NativeScheduler(synthetic_model(), thread=False, profile=True)
    h = sched.admit(Request([1, 2, 3], max_new_tokens=5))
    steps = 0
    while sched.step():
        steps += 1
    assert len(h.result(timeout=5).token_ids) == 5
    prof = sched.profile
    assert prof is not None and prof.iterations == steps + 1
    table = {p.phase: p for p in prof.table()}
    assert list(table) == list(PHASES)
    assert table["forward"].ms_per_iteration > 0 and table["sample"].ms_per_iteration > 0
    assert sum(p.share for p in table.values()) == pytest.approx(1.0)
    prof.reset()
    assert prof.iterations == 0 and all(v == 0 for v in prof.seconds.values())
    sched.close()


def test_off_by_default_and_on_by_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FAK_SCHED_PROFILE", raising=False)
    with NativeScheduler(synthetic_model(), thread=False) as sched:
        assert sched.profile is None
    monkeypatch.setenv("FAK_SCHED_PROFILE", "1")
    with NativeScheduler(synthetic_model(), thread=False) as sched:
        assert sched.profile is not None
