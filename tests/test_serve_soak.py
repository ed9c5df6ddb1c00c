"""A bounded soak of `fak serve` (synthetic model): 24 clients for ~10 s, a third hanging up mid-stream.
No 5xx, no lane or KV block left behind, RSS growth bounded."""

from __future__ import annotations

import asyncio
import random
import time

import httpx
import pytest

from serve_helpers import Server

pytestmark = pytest.mark.serve
CLIENTS, SECONDS = 24, 10.0


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


async def _client(url: str, i: int, statuses: list[int], stop_at: float) -> None:
    rng = random.Random(i)
    async with httpx.AsyncClient(timeout=60) as http:
        while time.monotonic() < stop_at:
            body = {"prompt": f"soak {i} {rng.random()}", "max_tokens": rng.randint(8, 200), "stream": True}
            async with http.stream("POST", url + "/v1/completions", json=body) as r:
                statuses.append(r.status_code)
                n = 0
                async for _ in r.aiter_lines():
                    n += 1
                    if i % 3 == 0 and n == 3:  # a third of the clients drop the connection mid-stream
                        break


def test_soak_no_5xx_no_leaks() -> None:
    s = Server("--gguf", "synthetic", "--max-queue", "0")
    try:
        httpx.post(s.url + "/v1/completions", json={"prompt": "warm", "max_tokens": 4}, timeout=30)
        rss0 = _rss_kib(s.proc.pid)
        statuses: list[int] = []

        async def run() -> None:
            stop_at = time.monotonic() + SECONDS
            await asyncio.gather(*(_client(s.url, i, statuses, stop_at) for i in range(CLIENTS)))

        asyncio.run(run())
        assert len(statuses) >= CLIENTS and set(statuses) == {200}, sorted(set(statuses))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and s.metric("fak_num_requests_running") + s.metric("fak_num_requests_waiting"):
            time.sleep(0.1)
        assert s.metric("fak_num_requests_running") == 0 and s.metric("fak_num_requests_waiting") == 0
        assert s.metric("fak_kv_cache_usage_perc") == 0.0  # every block back (prefix-cache blocks are free)
        assert s.metric('fak_sched_finished_total{reason="cancelled"}') >= 1  # the drops really cancelled lanes
        grown = (_rss_kib(s.proc.pid) - rss0) / 1024
        assert grown < 256, f"RSS grew by {grown:.0f} MiB"
    finally:
        assert s.stop() == 0
