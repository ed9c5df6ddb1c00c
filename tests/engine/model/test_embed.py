"""Model.embed (mean-pooled, L2-normalised last hidden state) against its definition, and
NativeScheduler.call (work run on the loop thread between iterations)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine.errors import EngineError
from engine.model.synthetic import synthetic_model
from engine.sched.lane import Request
from engine.sched.scheduler import NativeScheduler


def test_embed_is_the_mean_of_the_normed_last_state() -> None:
    m = synthetic_model()
    ids = [3, 17, 42, 99, 5, 5, 7]
    states, _ = m.hidden_states(ids)  # the last entry: after the output norm, every position
    mean = states[-1].astype(np.float64).mean(axis=0)
    want = mean / np.linalg.norm(mean)
    got = m.embed(ids)
    assert got.dtype == np.float32 and got.shape == (m.config.hidden,)
    assert np.max(np.abs(got - want)) < 1e-6
    assert np.max(np.abs(m.embed(ids[:3]) - got)) > 1e-3  # pooled over the input, not one position


def test_call_runs_on_the_loop_thread_between_requests() -> None:
    m = synthetic_model()
    with NativeScheduler(m) as s:
        h = s.admit(Request([1, 2, 3], max_new_tokens=8))
        where = s.call(lambda: (threading.current_thread().name, m.embed([1, 2, 3])))
        name, vec = where.result(timeout=60)
        assert name == "fak-scheduler" and vec.shape == (m.config.hidden,)
        boom = s.call(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            boom.result(timeout=60)
        assert len(h.result(timeout=60).token_ids) == 8  # the loop survived the failing call
    with pytest.raises(EngineError, match="closed"):
        s.call(lambda: None)


def test_call_without_a_thread_runs_in_step() -> None:
    m = synthetic_model()
    s = NativeScheduler(m, thread=False)
    fut = s.call(lambda: threading.current_thread().name)
    assert not fut.done()
    s.step()
    assert fut.result(timeout=0) == threading.current_thread().name
    s.close()
