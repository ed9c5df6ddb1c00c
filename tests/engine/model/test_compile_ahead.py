"""A cold warmup compiles the lane kernel in a second process (engine/model/compile_ahead.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from numba.core import event

from engine.model import compile_ahead as CA


class _Spans(event.Listener):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_start(self, ev: event.Event) -> None:
        self.seen.append("start")

    def on_end(self, ev: event.Event) -> None:
        self.seen.append("end")


def test_no_helper_when_turned_off_or_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CA, "lane_kernel_cached", lambda: False)
    monkeypatch.setenv("FAK_COMPILE_AHEAD", "0")
    assert CA.start("f32").proc is None
    monkeypatch.delenv("FAK_COMPILE_AHEAD")
    monkeypatch.setattr(CA, "lane_kernel_cached", lambda: True)
    assert CA.start("f32").proc is None
    assert CA.Ahead().wait() is False  # nothing started: nothing to wait for


def test_a_helper_past_its_time_is_killed_and_its_span_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CA, "TIMEOUT_S", 0.5)
    spans = _Spans()
    event.register(CA.KIND, spans)
    try:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        t0 = time.perf_counter()
        ahead = CA.Ahead(proc, started=t0)
        assert ahead.wait() is False
        assert time.perf_counter() - t0 < 10 and proc.poll() is not None
        assert ahead.wait() is False  # idempotent: the span ended once
        failed = CA.Ahead(subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]))
        assert failed.wait() is False
    finally:
        event.unregister(CA.KIND, spans)
    assert spans.seen == ["end", "end"]


@pytest.mark.slow
def test_a_cold_warmup_takes_the_lane_kernel_from_the_helpers_cache(tmp_path: Path) -> None:
    """In a fresh numba cache: the helper compiled the lane kernel, the warming process only loaded it (a
    cache hit, no miss), and the other kernels were compiled by the warming process."""
    code = ("import json; from engine.model.session import warmup; warmup(); "
            "from engine.kernels.lane_kernel import lane_layers; from engine.kernels import ops; "
            "s, o = lane_layers.stats, ops._rmsnorm.stats; "
            "print(json.dumps([sum(s.cache_hits.values()), sum(s.cache_misses.values()), sum(o.cache_misses.values())]))")
    env = {k: v for k, v in __import__("os").environ.items() if k != "FAK_COMPILE_AHEAD"}
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    hits, misses, others_compiled = json.loads(out.stdout.strip().splitlines()[-1])
    assert hits >= 1 and misses == 0 and others_compiled >= 1
