"""P/D across the process wire: prefill and decode nodes (engine/wire/node.py) driven by a PDHead over real
sockets and shared-memory rings (the nodes run in this process here; tests/test_pd_serve.py runs them as
`fak worker` processes). Greedy outputs equal a single scheduler's for 1, 2 and 3 decode nodes on both
transports; only suffix blocks move for a shared system prompt; a decode node that dies or stops answering
mid-stream has its requests resumed elsewhere with the same tokens; a dead prefill node's requests wait
for it (bounded: then an error, never a hang) and complete when it comes back; a decode node whose link
from the prefill node breaks is resumed elsewhere and rejoins; a worker with another model is refused
before anything moves."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
from rich.console import Console

from engine.errors import EngineError
from engine.grammar.spec import GrammarSpec
from engine.model.sampling import SamplingParams
from engine.pd.decode_node import DecodeNode
from engine.pd.head import PDHead
from engine.pd.prefill_node import PrefillNode
from engine.sched.lane import FinishReason, Request
from engine.sched.scheduler import NativeScheduler
from engine.wire.channel import Channel, ChannelClosed, parse_address
from engine.wire.node import probe
from engine.wire.spec import request_from_json, request_to_json
from fak.runtime.views import stats_view
from support.sched_helpers import model, rand_prompt, solo

pytestmark = pytest.mark.timeout(300)
BT, CHUNK = 16, 64


def _addr(node: object) -> str:
    h, p = node.address  # type: ignore[attr-defined]
    return f"{h}:{p}"


class Cluster:
    """n decode nodes, a prefill node and a head, all over sockets (and shm rings for transport="shm")."""

    def __init__(self, n: int, transport: str = "tcp", down_after: float = 5.0, hold_s: float = 30.0,
                 **kw: object) -> None:
        m = model()
        self.decoders = [DecodeNode(m, f"d{i}", block_tokens=BT, prefill_chunk=CHUNK, beat_s=0.1, **kw)
                         for i in range(n)]
        self.prefill = PrefillNode(m, block_tokens=BT, prefill_chunk=CHUNK, beat_s=0.1)
        self.head = PDHead(_addr(self.prefill), [_addr(d) for d in self.decoders], vocab_size=m.config.vocab_size,
                           identity=m.identity, block_tokens=BT, transport=transport, down_after=down_after,
                           hold_s=hold_s)

    def close(self) -> None:
        self.head.close()
        self.prefill.close()
        for d in self.decoders:
            d.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _mixed(seed: int = 0, n: int = 16, new: tuple[int, int] = (3, 12)) -> list[Request]:
    rng = np.random.default_rng(seed)
    shared = rand_prompt(rng, 70)
    reqs = []
    for i in range(n):
        p = rand_prompt(rng, int(rng.integers(3, 180)))
        if i % 4 == 0:
            p = shared + p[:30]
        reqs.append(Request(p, max_new_tokens=int(rng.integers(*new)), request_id=f"r{i}"))
    return reqs


def _single(reqs: list[Request]) -> list[list[int]]:
    with NativeScheduler(model(), block_tokens=BT, prefill_chunk=CHUNK) as s:
        hs = [s.admit(r) for r in reqs]
        return [h.result(timeout=120).token_ids for h in hs]


def _copy(r: Request) -> Request:
    return Request(r.prompt, max_new_tokens=r.max_new_tokens, request_id=r.request_id)


@pytest.mark.parametrize("transport,n", [("tcp", 1), ("tcp", 2), ("tcp", 3), ("shm", 1), ("shm", 2), ("shm", 3)])
def test_head_greedy_equals_single_scheduler(transport: str, n: int) -> None:
    reqs = _mixed()
    want = _single(reqs)
    with Cluster(n, transport) as c:
        got = [h.result(timeout=120) for h in [c.head.admit(_copy(r)) for r in reqs]]
        assert [r.error for r in got] == [None] * len(reqs)
        assert [r.token_ids for r in got] == want
        assert [r.request_id for r in got] == [r.request_id for r in reqs]
        assert all(r.finish_reason is FinishReason.LENGTH for r in got)
        st = [d.worker.sched.stats() for d in c.decoders]
        assert sum(s.imported for s in st) == len(reqs) and all(s.prefill_tokens == 0 for s in st)
        assert sum(1 for s in st if s.imported) == n  # every node took some
        assert sum(mv["requests"] for mv in c.head.moved.values()) == len(reqs)


def test_shared_system_prompt_moves_only_suffix_blocks() -> None:
    rng = np.random.default_rng(2)
    system = rand_prompt(rng, 256)
    a, b = system + rand_prompt(rng, 40), system + rand_prompt(rng, 40)
    with Cluster(2, "shm") as c:
        ra = c.head.admit(Request(a, max_new_tokens=5)).result(timeout=60)
        where = next(w for w, mv in c.head.moved.items() if mv["requests"] == 1)
        first = dict(c.head.moved[where])
        assert first["blocks"] == 19 and first["skipped_blocks"] == 0
        deadline = time.monotonic() + 10  # the residency events reach the router asynchronously
        while not c.head.router._resident[where] and time.monotonic() < deadline:
            time.sleep(0.02)
        rb = c.head.admit(Request(b, max_new_tokens=5)).result(timeout=60)
        assert c.head.router.counts["prefix"] == 1
        second = {k: c.head.moved[where][k] - first[k] for k in first}
        block_bytes = c.decoders[0].worker.sched.pool.block_bytes
        assert second["requests"] == 1 and second["skipped_blocks"] == 16 and second["blocks"] == 3
        assert 3 * block_bytes <= second["bytes"] < 3 * block_bytes + 4096 < first["bytes"]
        assert ra.token_ids == solo(a, 5, CHUNK) and rb.token_ids == solo(b, 5, CHUNK)


def _wait_streaming(c: Cluster, node: int, tokens: int, timeout: float = 60) -> None:
    """Until some request on decode node `node` has streamed at least `tokens` tokens."""
    name = f"decode-{node}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with c.head._lock:
            if any(j.worker == name and len(j.generated) >= tokens and j.phase == "decoding"
                   for j in c.head._jobs.values()):
                return
        time.sleep(0.005)
    raise AssertionError(f"nothing streamed {tokens} tokens on {name}")


@pytest.mark.parametrize("how", ["dies", "hangs"])
def test_decode_node_lost_mid_stream_requests_resume_with_same_tokens(how: str) -> None:
    reqs = _mixed(seed=5, n=8, new=(30, 45))
    want = _single(reqs)
    with Cluster(2, "tcp", down_after=1.0) as c:
        hs = [c.head.admit(_copy(r)) for r in reqs]
        _wait_streaming(c, 0, 3)
        victim = c.decoders[0]
        if how == "dies":
            victim.close()  # its sockets close: the head sees it at once
        else:
            victim.send_head = lambda *a, **k: False  # type: ignore[method-assign]  # alive, silent: no beats, no tokens
        got = [h.result(timeout=120) for h in hs]
        assert [r.error for r in got] == [None] * len(reqs)
        assert [r.token_ids for r in got] == want  # nothing lost, nothing repeated
        assert c.head.counts["down"] == 1 and c.head.counts["failed_over"] >= 1
        assert not c.head.decoders["decode-0"].up and c.head.pd_stats()["decode-0"]["up"] is False
        after = c.head.admit(_copy(reqs[0])).result(timeout=60)  # later requests avoid the lost node
        assert after.token_ids == want[0] and c.head.router.workers == ["decode-1"]
        con = Console(width=200, record=True, color_system=None)  # what fak top / fak serve --live draw
        con.print(stats_view("http://h", {"sched": c.head.stats().to_json(), "pd": c.head.pd_stats(), "model": "m",
                                          "status": "ready", "requests": 9}))
        out = con.export_text()
        assert "decode-0 (decode" in out and "DOWN" in out and "workers down 1" in out
        assert f"requests resumed {c.head.counts['resumed']}" in out and "decode-1 (decode" in out


def test_streams_continue_across_a_failover_without_repeats() -> None:
    rng = np.random.default_rng(7)
    prompt = rand_prompt(rng, 100)
    want = solo(prompt, 40, CHUNK)
    with Cluster(2, "shm") as c:
        h = c.head.admit(Request(prompt, max_new_tokens=40))
        seen: list[int] = []
        for t in h.tokens(timeout=60):
            seen.append(t)
            if len(seen) == 5:
                c.decoders[int(c.head._jobs[next(iter(c.head._jobs))].worker[-1])].close()
        assert seen == want == h.result(timeout=5).token_ids
        assert c.head.counts["failed_over"] == 1


def test_a_kv_import_that_lost_its_stage_is_rerouted_other_failures_are_not() -> None:
    """A pipelined decode worker whose stage restarted under a KV import (KVLost) hands the request back:
    the head re-routes it (prefill again, import again) and it finishes with the single scheduler's
    tokens. A frame refused for any other reason still fails the request with the worker's error."""
    from engine.model.kv import KVLost

    reqs = _mixed(n=2)
    want = _single(reqs)
    with Cluster(1) as c:
        w = c.decoders[0].worker
        real, faults = w.deliver, [KVLost("a pipeline stage restarted during this forward")]

        def deliver(*a: object, **kw: object) -> object:
            if faults:
                raise faults.pop()
            return real(*a, **kw)

        w.deliver = deliver  # type: ignore[method-assign]
        got = [c.head.admit(_copy(r)).result(timeout=120) for r in reqs]
        assert [r.error for r in got] == [None, None]
        assert [r.token_ids for r in got] == want
        assert c.head.counts["resumed"] == 1
        faults.append(EngineError("KV frame refused"))
        r = c.head.admit(_copy(reqs[0])).result(timeout=120)
        assert r.finish_reason is FinishReason.ERROR and "KV import failed: EngineError: KV frame refused" in (r.error or "")
        assert c.head.counts["resumed"] == 1


@pytest.mark.slow
def test_prefill_node_lost_fails_requests_within_the_hold_never_hangs() -> None:
    with Cluster(1, "tcp", down_after=1.0, hold_s=2.0) as c:
        c.prefill.worker.submit(lambda: time.sleep(1.5))  # the next prefills wait behind this
        hs = [c.head.admit(Request(list(range(1, 60)), max_new_tokens=4)) for _ in range(3)]
        time.sleep(0.3)
        t0 = time.monotonic()
        c.prefill.close()
        got = [h.result(timeout=30) for h in hs]
        assert time.monotonic() - t0 < 2.0 + 1.0 + 2.0  # the hold, the watcher's tick, slack
        assert all(r.finish_reason is FinishReason.ERROR and "no worker came back within 2 s" in (r.error or "")
                   and "prefill-0" in (r.error or "") for r in got), [r.error for r in got]
        r = c.head.admit(Request([1, 2, 3], max_new_tokens=2)).result(timeout=10)
        assert r.finish_reason is FinishReason.ERROR and "prefill-0" in (r.error or "")


@pytest.mark.slow
def test_prefill_node_that_comes_back_completes_the_requests_that_waited() -> None:
    rng = np.random.default_rng(3)
    prompts = [rand_prompt(rng, 40 + 7 * i) for i in range(3)]
    want = [solo(p, 6) for p in prompts]
    with Cluster(2, "tcp", down_after=1.0, hold_s=60.0) as c:
        host, port = c.prefill.address
        c.prefill.worker.submit(lambda: time.sleep(1.0))  # the requests are still queued there when it dies
        hs = [c.head.admit(Request(p, max_new_tokens=6)) for p in prompts]
        time.sleep(0.2)
        c.prefill.close()
        time.sleep(1.5)  # marked down; the requests wait
        assert all(h._result is None for h in hs)
        c.prefill = PrefillNode(model(), block_tokens=BT, prefill_chunk=CHUNK, beat_s=0.1, host=host, port=port)
        got = [h.result(timeout=60) for h in hs]
        assert [r.token_ids for r in got] == want, [r.error for r in got]
        assert c.head.counts.get("rejoined", 0) >= 1


def test_a_broken_prefill_to_decode_link_resumes_what_it_lost_and_relinks() -> None:
    """The decode node's inbound KV link breaks while the head still hears it: the delivery on it is lost,
    so that request starts again (same tokens), and the node is re-linked and used again."""
    rng = np.random.default_rng(4)
    prompts = [rand_prompt(rng, 50 + 5 * i) for i in range(4)]
    want = [solo(p, 8) for p in prompts]
    with Cluster(2, "tcp") as c:
        target = c.decoders[0]
        real = target._deliver
        cut = {"n": 0}

        def deliver_then_cut(header: dict, logits: np.ndarray, frame: memoryview) -> None:
            if cut["n"] == 0:  # the first delivery is lost with the link (as if tampered with and dropped)
                cut["n"] += 1
                link = c.prefill._links["decode-0"]
                link.channel.sock.shutdown(socket.SHUT_RDWR)  # type: ignore[attr-defined]
                return
            real(header, logits, frame)

        target._deliver = deliver_then_cut  # type: ignore[method-assign]
        real_route = c.head.router.route

        def first_to_decode_0(hashes: list[int], load: dict[str, int]) -> object:
            c.head.router.route = real_route  # type: ignore[method-assign]
            return type("Route", (), {"worker": "decode-0"})()

        c.head.router.route = first_to_decode_0  # type: ignore[method-assign]
        h0 = c.head.admit(Request(prompts[0], max_new_tokens=8))
        got = [h0.result(timeout=60)] + [c.head.admit(Request(p, max_new_tokens=8)).result(timeout=60)
                                         for p in prompts[1:]]
        assert [r.token_ids for r in got] == want, [r.error for r in got]
        assert c.head.counts["links_lost"] >= 1 and c.head.counts["resumed"] >= 1
        assert c.head.decoders["decode-0"].up and "decode-0" in c.prefill._links  # re-linked
        assert c.head.moved["decode-0"]["requests"] >= 2  # and used again (one lost, then more)


def test_worker_of_another_model_or_role_is_refused() -> None:
    m = model()
    d = DecodeNode(m, block_tokens=BT, prefill_chunk=CHUNK)
    p = PrefillNode(m, block_tokens=BT, prefill_chunk=CHUNK)
    try:
        with pytest.raises(EngineError, match="serves another model"):
            PDHead(_addr(p), [_addr(d)], vocab_size=m.config.vocab_size, identity=b"\0" * 32, block_tokens=BT)
        with pytest.raises(EngineError, match="is a decode worker, not a prefill worker"):
            PDHead(_addr(d), [_addr(d)], vocab_size=m.config.vocab_size, identity=m.identity, block_tokens=BT)
        with pytest.raises(EngineError, match="KV blocks hold 16 tokens, this server's 32"):
            PDHead(_addr(p), [_addr(d)], vocab_size=m.config.vocab_size, identity=m.identity, block_tokens=32)
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
        free.close()
        with pytest.raises(EngineError, match="not reachable"):
            PDHead(_addr(p), [f"127.0.0.1:{port}"], vocab_size=m.config.vocab_size, connect_timeout=0.5)
        assert probe(_addr(p))["role"] == "prefill" and probe(_addr(d))["role"] == "decode"
    finally:
        d.close()
        p.close()


def test_channel_refuses_garbage_and_bad_hellos() -> None:
    m = model()
    d = DecodeNode(m, block_tokens=BT, prefill_chunk=CHUNK)
    try:
        host, port = parse_address(_addr(d))
        s = socket.create_connection((host, port))
        s.sendall(b"GET / HTTP/1.1\r\n\r\n" + b"x" * 64)  # not a channel message: the node hangs up
        s.settimeout(5)
        assert s.recv(100) == b""
        s.close()
        ch = Channel.connect(host, port)
        ch.send({"op": "hello", "as": "head", "protocol": 99})
        hello, _ = ch.recv(5)
        assert "protocol 99" in hello["error"]
        with pytest.raises(ChannelClosed):
            ch.recv(5)
        ch.close()
        assert d.worker.sched.stats().imported == 0  # nothing reached the scheduler
    finally:
        d.close()


def test_bad_requests_are_refused_at_the_head() -> None:
    with Cluster(1) as c:
        with pytest.raises(EngineError, match="empty prompt"):
            c.head.admit(Request([], max_new_tokens=2))
        with pytest.raises(EngineError, match="outside the vocabulary"):
            c.head.admit(Request([10**6], max_new_tokens=2))
        h = c.head.admit(Request(list(range(1, 40)), max_new_tokens=200))
        next(iter(h.tokens(timeout=30)))
        h.cancel()
        r = h.result(timeout=30)
        assert r.finish_reason is FinishReason.CANCELLED and 1 <= len(r.token_ids) < 200
        deadline = time.monotonic() + 10
        while c.head.loads()["decode-0"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.head.loads() == {"decode-0": 0}


def test_request_spec_round_trips() -> None:
    r = Request([1, 2, 3], max_new_tokens=7, stop_ids=(5,), request_id="x", logprobs=2, scope="s", tainted=True,
                verdict="TRANSFORM", sampling=SamplingParams(temperature=0.7, top_k=5, seed=3, logit_bias={4: -1.0}),
                grammar=GrammarSpec.sequence("a", GrammarSpec.json_schema({"type": "object"}, (", ", ": "))))
    back = request_from_json(request_to_json(r), [1, 2, 3])
    for f in ("max_new_tokens", "stop_ids", "request_id", "logprobs", "scope", "tainted", "verdict", "sampling",
              "grammar"):
        assert getattr(back, f) == getattr(r, f), f


def test_cores_are_split_so_decode_never_waits_for_a_prefill() -> None:
    from fak.runtime.local import split_cores

    assert split_cores([0, 1], 1) == ([0], [[1]], False)  # a core each
    assert split_cores([0, 1], 2) == ([0, 1], [[0], [1]], True)  # each decoder a core, prefill niced on both
    assert split_cores([0, 1, 2, 3], 2) == ([0, 1], [[2], [3]], False)
    assert split_cores([0, 1, 2, 3], 3) == ([0], [[1], [2], [3]], False)
    assert split_cores(list(range(8)), 2) == ([0, 1, 2, 3], [[4, 5], [6, 7]], False)
    assert split_cores([0], 2) == ([0], [[0], [0]], False)
