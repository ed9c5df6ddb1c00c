"""What `fak guard` adds to an agent's round trip: the same streamed request (text + 2 tool calls,
argument JSON cut into 7-byte pieces) sent straight to the scripted fake upstream and through the
guard's gateway (tool results admitted, both calls held, judged by the coding floor and journaled
with fsync, the reply re-framed), alternated, on one machine.

    python bench/guard.py [--n 200] [--wire anthropic|chat|responses] [--no-fsync]

Prints the median and p90 of time to first byte and of the whole reply, each way, the added
milliseconds, and the policy's own cost per call (the coding floor on the two calls, no I/O).
The fake upstream answers at once, so the added time is all the guard's: a real provider's seconds
per turn dwarf it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fak.core.abi import ToolCall  # noqa: E402
from fak.core.journal import Journal  # noqa: E402
from fak.core.kernel import Kernel  # noqa: E402
from fak.core.policy import coding_floor  # noqa: E402
from fak.gateway.local import LocalServer  # noqa: E402
from fak.guard.proxy import HEALTH, proxy_app  # noqa: E402
from fak.guard.state import Guard  # noqa: E402
from support.fake_upstream import FakeUpstream, first_turn  # noqa: E402

SHELL = {"anthropic": {"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}},
         "chat": {"type": "function", "function": {"name": "Bash", "parameters": {
             "type": "object", "properties": {"command": {"type": "string"}}}}},
         "responses": {"type": "function", "name": "exec_command", "parameters": {
             "type": "object", "properties": {"cmd": {"type": "string"}}}}}
PATH = {"anthropic": "/v1/messages", "chat": "/v1/chat/completions", "responses": "/v1/responses"}


def body(wire: str) -> dict:
    result = "total 8\n-rw-r--r-- 1 me me 120 README.md\n" * 20
    if wire == "anthropic":
        return {"model": "m", "max_tokens": 64, "stream": True, "tools": [SHELL[wire]], "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t0", "name": "Bash", "input": {"command": "ls -la"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t0", "content": result},
                                         {"type": "text", "text": "now fix it"}]}]}
    if wire == "chat":
        return {"model": "m", "stream": True, "tools": [SHELL[wire]], "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant",
             "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c0", "content": result}, {"role": "user", "content": "now fix it"}]}
    return {"model": "m", "stream": True, "tools": [SHELL[wire]], "input": [
        {"role": "user", "content": "go"}, {"type": "function_call", "call_id": "c0", "name": "exec_command", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c0", "output": result}, {"role": "user", "content": "now fix it"}]}


async def once(client: httpx.AsyncClient, url: str, payload: dict) -> tuple[float, float]:
    t0 = time.perf_counter()
    first = None
    async with client.stream("POST", url, content=json.dumps(payload).encode(),
                             headers={"content-type": "application/json"}) as r:
        async for _ in r.aiter_bytes():
            if first is None:
                first = time.perf_counter() - t0
    return first or 0.0, time.perf_counter() - t0


async def run(n: int, direct: str, guarded: str, payload: dict) -> dict[str, list[tuple[float, float]]]:
    got: dict[str, list[tuple[float, float]]] = {"direct": [], "guard": []}
    async with httpx.AsyncClient(timeout=30) as c:
        for _ in range(10):  # warm both paths
            await once(c, direct, payload)
            await once(c, guarded, payload)
        for _ in range(n):
            got["direct"].append(await once(c, direct, payload))
            got["guard"].append(await once(c, guarded, payload))
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--wire", choices=tuple(PATH), default="anthropic")
    ap.add_argument("--no-fsync", action="store_true")
    a = ap.parse_args()
    payload = body(a.wire)
    with tempfile.TemporaryDirectory() as d, FakeUpstream(first_turn("ls -la", "rm -rf ~")) as up:
        kernel = Kernel.with_policy(coding_floor())
        kernel.journal = Journal(Path(d) / "j.jsonl", fsync=not a.no_fsync)
        gw = LocalServer(proxy_app(up.url, Guard(kernel)), HEALTH)
        gw.start(timeout=20)
        got = asyncio.run(run(a.n, up.url + PATH[a.wire], gw.url + PATH[a.wire], payload))
        gw.stop()
    ms = {k: ([1e3 * f for f, _ in v], [1e3 * t for _, t in v]) for k, v in got.items()}

    def q(xs: list[float], p: float) -> float:
        return statistics.quantiles(xs, n=100)[int(p) - 1] if p < 100 else max(xs)

    print(f"{a.wire} wire, {a.n} streamed replies each way (text + 2 tool calls), journal fsync {'off' if a.no_fsync else 'on'}")
    print(f"{'':8} {'TTFB p50':>9} {'p90':>7} {'total p50':>10} {'p90':>7}  (ms)")
    for k in ("direct", "guard"):
        f, t = ms[k]
        print(f"{k:8} {statistics.median(f):9.2f} {q(f, 90):7.2f} {statistics.median(t):10.2f} {q(t, 90):7.2f}")
    added = statistics.median(ms["guard"][1]) - statistics.median(ms["direct"][1])
    print(f"added by the guard: {added:.2f} ms per reply (median total)")
    floor = coding_floor()
    calls = [ToolCall("tool", "Bash", args=json.dumps({"command": c}).encode()) for c in ("ls -la", "rm -rf ~")]
    t0 = time.perf_counter()
    reps = 2000
    for _ in range(reps):
        for call in calls:
            floor(ToolCall("tool", call.tool, args=call.args))
    print(f"coding floor: {1e6 * (time.perf_counter() - t0) / (2 * reps):.1f} µs per call (fresh ToolCall each, no journal)")


if __name__ == "__main__":
    main()
