"""KV that survives a restart, through real `fak serve` processes: a known long prompt is prefilled once,
the server is stopped and started again on the same --kv-cache-dir, and the restarted server maps the
prompt from disk (its /metrics say so: blocks read, prompt tokens prefilled) and answers with the same
greedy tokens. A second turn in the same process is served from memory."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from support.serve_helpers import Server

pytestmark = [pytest.mark.serve, pytest.mark.slow]
N_PROMPT = 3000  # the synthetic checkpoint's context is 4096


def _complete(s: Server, ids: list[int]) -> list[int]:
    r = httpx.post(s.url + "/v1/completions", json={"model": "synthetic", "prompt": ids, "max_tokens": 8,
                                                     "temperature": 0, "logprobs": 0}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["logprobs"]["tokens"]


def _stats(s: Server) -> dict:  # type: ignore[type-arg]
    return httpx.get(s.url + "/fak/stats", timeout=10).json()["sched"]


def test_a_restarted_server_maps_a_known_prompt_from_disk(tmp_path: Path) -> None:
    ids = [int(t) for t in np.random.default_rng(0).integers(3, 250, N_PROMPT)]
    args = ("--gguf", "synthetic", "--kv-cache-dir", str(tmp_path))
    first = Server(*args)
    try:
        cold = _complete(first, ids)
        st = _stats(first)
        assert st["prefill_tokens"] == N_PROMPT and st["kv_disk_hits"] == 0
        again = _complete(first, ids)  # the next turn in the same process: memory, not disk
        st = _stats(first)
        assert again == cold and st["prefix_hit_tokens"] >= N_PROMPT - 64 and st["kv_disk_hits"] == 0
    finally:
        assert first.stop() == 0  # the stop flushes every queued block to disk
    files = list((tmp_path).rglob("*.kv"))
    assert len(files) >= N_PROMPT // 16
    second = Server(*args)
    try:
        warm = _complete(second, ids)
        st = _stats(second)
        assert warm == cold
        full_chunks = (N_PROMPT - 1) // 64 * 64
        assert st["kv_disk_hits"] == full_chunks // 16
        assert st["prefill_tokens"] == N_PROMPT - full_chunks  # < 2% of the prompt computed again
        assert second.metric("fak_kv_disk_hits_total") == full_chunks // 16
        assert second.metric("fak_kv_disk_refused_total") == 0
    finally:
        assert second.stop() == 0
    off = Server("--gguf", "synthetic", "--no-kv-cache-dir")
    try:
        assert _complete(off, ids) == cold
        assert _stats(off)["kv_disk_hits"] == 0 and _stats(off)["prefill_tokens"] == N_PROMPT
    finally:
        assert off.stop() == 0
