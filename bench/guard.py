"""What `fak guard` adds to an agent's round trip: the same streamed request (text + 2 tool calls,
argument JSON cut into 7-byte pieces) sent straight to the scripted fake upstream and through the
guard's gateway (tool results admitted, both calls held, judged by the coding floor and journaled
with fsync, the reply re-framed), alternated, on one machine.

    python bench/guard.py [--n 200] [--wire anthropic|chat|responses] [--no-fsync] [--sandbox]

Prints the median and p90 of time to first byte and of the whole reply, each way, the added
milliseconds, and the policy's own cost per call (the coding floor on the two calls, no I/O).
The client is a separate process (as an agent is): it does not share the gateway's GIL. --sandbox
adds a third way: the same client inside `fak guard`'s bubblewrap sandbox, where the gateway's URL
is the relay on the sandbox's loopback, forwarding to the gateway's unix socket.
The fake upstream answers at once, so the added time is all the guard's: a real provider's seconds
per turn dwarf it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the repo's fak first: tests/fak/ (the tests' mirror) is not it


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


async def run(n: int, urls: dict[str, str], payload: dict) -> dict[str, list[tuple[float, float]]]:
    """Each URL `n` times, alternated, after 10 warm-up rounds."""
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in urls}
    async with httpx.AsyncClient(timeout=30, trust_env=False) as c:
        for i in range(10 + n):
            for k, url in urls.items():
                t = await once(c, url, payload)
                if i >= 10:
                    got[k].append(t)
    return got


def spawn_client(prefix: list[str], n: int, urls: dict[str, str], wire: str) -> subprocess.Popen:
    """The client in its own process (`prefix` wraps it: bwrap's argv, or nothing)."""
    cmd = [*prefix, sys.executable, str(Path(__file__).resolve()), "--client", json.dumps(urls), "--n", str(n),
           "--wire", wire]
    info = [int(cmd[cmd.index("--info-fd") + 1])] if "--info-fd" in prefix else []
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, pass_fds=info)


def collect(p: subprocess.Popen) -> dict[str, list[tuple[float, float]]]:
    out, _ = p.communicate(timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"the client failed ({p.returncode})")
    return {k: [tuple(x) for x in v] for k, v in json.loads(out).items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--wire", choices=tuple(PATH), default="anthropic")
    ap.add_argument("--no-fsync", action="store_true")
    ap.add_argument("--sandbox", action="store_true", help="also: the client inside the guard's sandbox")
    ap.add_argument("--client", help=argparse.SUPPRESS)  # internal: be the client for these URLs (JSON)
    a = ap.parse_args()
    payload = body(a.wire)
    if a.client:  # httpx only: the client may run inside the sandbox, where numba cannot write its cache
        print(json.dumps(asyncio.run(run(a.n, json.loads(a.client), payload))))
        return
    from fak.core.abi import ToolCall
    from fak.core.journal import Journal
    from fak.core.kernel import Kernel
    from fak.core.policy import coding_floor
    from fak.gateway.local import LocalServer
    from fak.guard.proxy import HEALTH, proxy_app
    from fak.guard.state import Guard
    from support.fake_upstream import FakeUpstream, first_turn

    with tempfile.TemporaryDirectory() as d, FakeUpstream(first_turn("ls -la", "rm -rf ~")) as up:
        kernel = Kernel.with_policy(coding_floor())
        kernel.journal = Journal(Path(d) / "j.jsonl", fsync=not a.no_fsync)
        box = None
        if a.sandbox:
            from fak.sandbox import Session

            box = Session(who="bench/guard.py")
        gw = LocalServer(proxy_app(up.url, Guard(kernel)), HEALTH, unix=str(box.gateway_socket) if box else None)
        gw.start(timeout=20)
        got = collect(spawn_client([], a.n, {"direct": up.url + PATH[a.wire], "guard": gw.url + PATH[a.wire]}, a.wire))
        if box is not None:
            proj = Path(d) / "project"
            proj.mkdir()
            box.configure(proj, os.path.expanduser("~"), gateway_port=gw.sock.getsockname()[1])
            p = spawn_client(box.wrap([]), a.n, {"guard+sandbox": gw.url + PATH[a.wire]}, a.wire)
            box.spawned()
            got.update(collect(p))
            box.close()
        gw.stop()
    ms = {k: ([1e3 * f for f, _ in v], [1e3 * t for _, t in v]) for k, v in got.items()}

    def q(xs: list[float], p: float) -> float:
        return statistics.quantiles(xs, n=100)[int(p) - 1] if p < 100 else max(xs)

    print(f"{a.wire} wire, {a.n} streamed replies each way (text + 2 tool calls), journal fsync {'off' if a.no_fsync else 'on'}")
    print(f"{'':13} {'TTFB p50':>9} {'p90':>7} {'total p50':>10} {'p90':>7}  (ms)")
    for k in ms:
        f, t = ms[k]
        print(f"{k:13} {statistics.median(f):9.2f} {q(f, 90):7.2f} {statistics.median(t):10.2f} {q(t, 90):7.2f}")
    base = statistics.median(ms["direct"][1])
    for k in ms:
        if k != "direct":
            print(f"added by the {k}: {statistics.median(ms[k][1]) - base:.2f} ms per reply (median total)")
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
