"""Many machines for real: `fak worker` processes each on a host of its own (a network namespace, see
tests/support/netns.py), the head in this process on the bridge, every link keyed and sealed.

P/D 1:2 and two pipeline stages across hosts give the single process's greedy tokens for 16 concurrent
requests. A man in the middle on a fourth host flips a K/V byte, replays or reorders deliveries: caught,
the request starts again, the tokens are the same and no frame ever reached a pool. A cable cut mid-stream
and a host killed mid-stream lose no request and repeat no token; the host that comes back is taken back.
A partition that does not heal fails what it strands with a clear error within down_after + hold_s. A
pipeline stage whose cable is cut 12 s mid-stream and plugged back is taken back: the same tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from engine.sched.lane import FinishReason, Request
from support.netns import Hosts, make_hosts
from support.paths import REPO

pytestmark = [pytest.mark.gemma, pytest.mark.slow, pytest.mark.timeout(900)]
MODEL = "gemma3-270m"
KEY = "multihost test cluster key, 32+ characters long"
N_REQ, NEW = 16, 10
LONG = 120  # tokens a stream runs when a fault meets it mid-way: long enough that it is still under way


class Net:
    """Four hosts: 1 prefill, 2 and 3 decode, 4 free (a man in the middle, a stage). Workers by name."""

    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts
        self.procs: dict[str, tuple[int, subprocess.Popen[str], str]] = {}

    def worker(self, name: str, host: int, role: str, *extra: str, port: int = 0) -> str:
        env = {**os.environ, "FAK_PD_KEY": KEY, "NUMBA_NUM_THREADS": "1"}
        p = self.hosts.popen(host, [sys.executable, "-m", "commands.main", "worker", "--role", role, "--name", name,
                                    "--listen", f"{self.hosts.addr(host)}:{port}", "--gguf", MODEL,
                                    "--exit-with-parent", *extra],
                             cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line, f"worker {name} on host {host} did not start"
        address = str(json.loads(line)["address"])
        self.procs[name] = (host, p, address)
        return address

    def mitm(self, host: int, target: str, attack: dict[str, Any]) -> tuple[str, subprocess.Popen[str]]:
        p = self.hosts.popen(host, [sys.executable, str(REPO / "tests" / "support" / "mitm.py"),
                                    f"{self.hosts.addr(host)}:0", target, json.dumps(attack)],
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None
        port = json.loads(p.stdout.readline())["port"]
        return f"{self.hosts.addr(host)}:{port}", p


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    with make_hosts(4) as hosts:
        n = Net(hosts)
        n.worker("prefill-0", 1, "prefill")
        n.worker("decode-0", 2, "decode")
        n.worker("decode-1", 3, "decode")
        yield n


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    """The single process's greedy tokens for the prompts (NativeScheduler, same model)."""
    from fak.runtime.boot import boot

    b = boot(MODEL, show=False)
    assert b.tokenizer is not None and b.scheduler is not None
    prompts = [b.tokenizer.encode(f"Story {i}: the {w} walked into the" + " and then" * (i % 5))
               for i, w in enumerate(["cat", "dog", "fox", "owl"] * 4)]
    hs = [b.scheduler.admit(Request(p, max_new_tokens=NEW)) for p in prompts]
    want = [h.result(timeout=300).token_ids for h in hs]
    b.scheduler.close()
    return {"prompts": prompts, "want": want}


def _head(net: Net, workers: list[str], **kw: Any) -> Any:
    from fak.runtime.topology import boot_pd

    return boot_pd(MODEL, workers=workers, key=KEY.encode(), **kw).scheduler


def _addresses(net: Net, *names: str) -> list[str]:
    return [net.procs[n][2] for n in names]


def _run_all(head: Any, prompts: list[list[int]], new: int = NEW) -> list[Any]:
    hs = [head.admit(Request(p, max_new_tokens=new)) for p in prompts]
    return [h.result(timeout=300) for h in hs]


def test_pd_one_prefill_two_decode_hosts_equals_one_process(net: Net, reference: dict[str, Any]) -> None:
    head = _head(net, _addresses(net, "prefill-0", "decode-0", "decode-1"))
    try:
        got = _run_all(head, reference["prompts"])
        assert [r.token_ids for r in got] == reference["want"], [r.error for r in got]
        assert all(p.channel is not None and p.channel.session is not None  # every link keyed and sealed
                   for p in [head.prefill, *head.decoders.values()])
        moved = head.moved
        assert all(moved[n]["requests"] > 0 for n in ("decode-0", "decode-1"))  # both hosts served
        assert all(p.address.startswith(net.hosts.addr(1).rsplit(".", 1)[0]) for p in head.decoders.values())
    finally:
        head.close()


def test_a_head_without_the_key_or_with_another_is_refused_at_the_handshake(net: Net) -> None:
    from fak.errors import FakError
    from fak.runtime.topology import boot_pd

    workers = _addresses(net, "prefill-0", "decode-0", "decode-1")
    with pytest.raises(FakError, match="requires the cluster key"):
        boot_pd(MODEL, workers=workers)
    with pytest.raises(FakError, match="does not hold the cluster key"):
        boot_pd(MODEL, workers=workers, key=b"some other key of a decent length!")


@pytest.mark.parametrize("action", ["flip", "replay", "reorder"])
def test_a_man_in_the_middle_on_a_third_host_is_caught_and_costs_no_request(net: Net, reference: dict[str, Any],
                                                                           action: str) -> None:
    """The prefill -> decode-0 deliveries go through host 4, which attacks one of them. The link drops it
    unread (no frame reaches the decode worker's import: its refused count stays 0), the request starts
    again and every output equals the single process's."""
    via, proxy = net.mitm(4, net.procs["decode-0"][2], {"op": "deliver", "action": action})
    pre, d1 = _addresses(net, "prefill-0", "decode-1")
    head = _head(net, [pre, via, d1])
    try:
        prompts, want = reference["prompts"][:6], reference["want"][:6]
        got = _run_all(head, prompts)
        assert [r.token_ids for r in got] == want, [r.error for r in got]
        proxy.terminate()
        out = proxy.communicate(timeout=10)[0]
        assert f'"mitm": "{"hold" if action == "reorder" else action}"' in out  # the attack happened
        assert head.counts.get("links_lost", 0) + head.counts["down"] >= 1 and head.counts["resumed"] >= 1
        stats = head.pd_stats()
        assert stats["decode-0"].get("refused", 0) == 0  # caught by the link's seal, before any frame import
    finally:
        head.close()
        if proxy.poll() is None:
            proxy.kill()


def _streamed(h: Any) -> list[int]:
    return [t for t, _ in h.snapshot(0)[0] if t >= 0]


def _stream_until_tokens(head: Any, prompts: list[list[int]], new: int, on: str | None = None) -> list[Any]:
    """Admit the prompts and return once every stream is under way and `on` still holds some of them
    (the fault that follows must meet work in flight there, or the test proves nothing)."""
    hs = [head.admit(Request(p, max_new_tokens=new)) for p in prompts]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(len(_streamed(h)) >= 2 for h in hs):  # every stream under way
        time.sleep(0.05)
    assert on is None or head.loads()[on] >= 1, f"no stream left on {on} to cut: {head.loads()}"
    return hs


def _wait(cond: Any, within: float) -> bool:
    deadline = time.monotonic() + within
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.1)
    return bool(cond())


def test_a_cable_cut_mid_stream_loses_nothing_and_the_host_is_taken_back(net: Net, reference: dict[str, Any]) -> None:
    head = _head(net, _addresses(net, "prefill-0", "decode-0", "decode-1"))
    try:
        long = [p for p in reference["prompts"][:6]]
        want = _run_all(head, long, new=LONG)  # the uninterrupted run (greedy)
        hs = _stream_until_tokens(head, long, LONG, on="decode-0")
        t0 = time.monotonic()
        net.hosts.link_down(2)  # decode-0's cable: silence, no RST
        got = [h.result(timeout=120) for h in hs]
        assert [r.token_ids for r in got] == [r.token_ids for r in want], [r.error for r in got]
        assert all(r.finish_reason is FinishReason.LENGTH for r in got)
        # its streams were under way at the cut: they could only finish once the head took it for down
        assert not head.decoders["decode-0"].up and head.counts["resumed"] >= 1 and time.monotonic() - t0 < 60
        net.hosts.link_up(2)
        _wait(lambda: head.decoders["decode-0"].up and head.counts.get("rejoined", 0) >= 1, 30)
        assert head.decoders["decode-0"].up and head.counts.get("rejoined", 0) >= 1  # the healed host is back
        again = _run_all(head, reference["prompts"][:4])
        assert [r.token_ids for r in again] == reference["want"][:4]
    finally:
        net.hosts.link_up(2)
        head.close()


def test_a_host_killed_mid_stream_loses_nothing_and_its_return_is_taken_back(net: Net,
                                                                             reference: dict[str, Any]) -> None:
    head = _head(net, _addresses(net, "prefill-0", "decode-0", "decode-1"))
    try:
        prompts = reference["prompts"][6:12]
        want = _run_all(head, prompts, new=LONG)
        hs = _stream_until_tokens(head, prompts, LONG, on="decode-1")
        port = int(net.procs["decode-1"][2].rsplit(":", 1)[1])
        net.hosts.kill(3)  # every process on decode-1's host
        got = [h.result(timeout=120) for h in hs]
        assert [r.token_ids for r in got] == [r.token_ids for r in want], [r.error for r in got]
        for r, h in zip(got, hs, strict=True):  # streamed exactly once: no token lost or repeated
            assert _streamed(h) == r.token_ids
        assert not head.decoders["decode-1"].up and head.counts["resumed"] >= 1  # it was under way there
        net.worker("decode-1", 3, "decode", port=port)  # the host comes back, same address
        # up comes first (connected), the count once the prefill worker has linked it: wait for both
        _wait(lambda: head.decoders["decode-1"].up and head.counts.get("rejoined", 0) >= 1, 30)
        assert head.decoders["decode-1"].up and head.counts.get("rejoined", 0) >= 1
    finally:
        head.close()


def test_a_partition_that_does_not_heal_fails_what_it_strands_within_the_bound(net: Net,
                                                                             reference: dict[str, Any]) -> None:
    head = _head(net, _addresses(net, "prefill-0", "decode-0", "decode-1"), down_after=2.0)
    head.hold_s = 4.0
    try:
        net.hosts.link_down(1)  # the prefill host is cut off for good
        t0 = time.monotonic()
        got = _run_all(head, reference["prompts"][:3])
        took = time.monotonic() - t0
        assert all(r.finish_reason is FinishReason.ERROR for r in got)
        assert all("no worker came back within 4 s" in (r.error or "") and "prefill-0" in (r.error or "")
                   for r in got), [r.error for r in got]
        assert took < 2.0 + 4.0 + 5.0, took  # down_after + hold_s + a watcher tick and slack
    finally:
        net.hosts.link_up(1)
        head.close()


def test_two_pipeline_stages_on_two_hosts_equal_one_process(net: Net, reference: dict[str, Any]) -> None:
    from fak.runtime.topology import boot_pipeline

    s0 = net.worker("stage-0", 4, "stage", "--layers", "0:9")
    s1 = net.worker("stage-1", 2, "stage", "--layers", "9:18")
    b = boot_pipeline(MODEL, workers=[s0, s1], key=KEY.encode())
    try:
        got = _run_all(b.scheduler, reference["prompts"])
        assert [r.token_ids for r in got] == reference["want"], [r.error for r in got]
        p = b.scheduler.model.pipeline
        assert all(s.ch.session is not None for s in p.stages)  # keyed, sealed stage links
        # stage 1's cable cut mid-stream long enough to be noticed, then plugged back: the
        # pipeline takes the stage back at its address, re-links, recomputes its lanes; the same tokens
        prompts = reference["prompts"][:4]
        want = _run_all(b.scheduler, prompts, new=40)
        hs = _stream_until_tokens(b.scheduler, prompts, 40)
        net.hosts.link_down(2)
        time.sleep(12)  # past TCP_USER_TIMEOUT (10 s): the busy links fail, the stage is taken for gone
        net.hosts.link_up(2)
        after = [h.result(timeout=180) for h in hs]
        assert [r.token_ids for r in after] == [r.token_ids for r in want], [r.error for r in after]
        assert p.stats.get("recoveries", 0) >= 1
    finally:
        net.hosts.link_up(2)
        b.scheduler.close()
        for n in ("stage-0", "stage-1"):
            net.procs[n][1].kill()
