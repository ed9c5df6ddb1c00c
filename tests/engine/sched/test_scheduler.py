"""NativeScheduler behaviour on the synthetic model: batching invariance, queues, stops, cancel, close."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine import Session
from engine.errors import EngineError
from engine.model.sampling import Sampler, SamplingParams, sample
from engine.sched.lane import FinishReason, Handle, Lane, LaneState, Request, TextTracker
from engine.sched.scheduler import NativeScheduler
from support.numba_threads import ParallelLaunches
from support.sched_helpers import model, rand_prompt, solo


def test_concurrent_greedy_outputs_equal_solo_and_stream_matches_result() -> None:
    rng = np.random.default_rng(0)
    prompts = [rand_prompt(rng, n) for n in (3, 17, 40, 9, 150, 1)]
    with ParallelLaunches() as launches, NativeScheduler(model(), prefill_chunk=32) as sched:
        handles = [sched.admit(Request(p, max_new_tokens=12)) for p in prompts]
        streamed = [list(h) for h in handles]
        results = [h.result(timeout=60) for h in handles]
    launches.assert_multithreaded("fak-scheduler")  # the loop thread ran parallel kernels on >= 2 threads
    for p, s, r in zip(prompts, streamed, results, strict=False):
        assert r.finish_reason is FinishReason.LENGTH
        assert r.token_ids == s == solo(p, 12, 32)
        assert r.prompt_tokens == len(p) and r.ttft_s is not None and r.ttft_s <= r.latency_s
    assert sched.pool.num_used == 0


def test_max_running_bound_and_fifo_promotion() -> None:
    sched = NativeScheduler(model(), max_running=2, thread=False, prefix_cache=False)
    rng = np.random.default_rng(1)
    hs = [sched.admit(Request(rand_prompt(rng, 5), max_new_tokens=4)) for _ in range(5)]
    order: list[int] = []
    while sched.step():
        assert sched.stats().running <= 2
        for i, h in enumerate(hs):
            if h.state is not LaneState.WAITING and i not in order:
                order.append(i)
    assert order == [0, 1, 2, 3, 4]
    assert sched.stats().max_running_observed == 2
    assert all(h.result(0).finish_reason is FinishReason.LENGTH for h in hs)
    sched.close()


def test_earliest_deadline_first_then_fifo() -> None:
    sched = NativeScheduler(model(), max_running=1, thread=False)
    p = [1, 2, 3]
    h_none = sched.admit(Request(p, max_new_tokens=2))
    h_late = sched.admit(Request(p, max_new_tokens=2, deadline=20.0))
    h_soon = sched.admit(Request(p, max_new_tokens=2, deadline=10.0))
    h_none2 = sched.admit(Request(p, max_new_tokens=2))
    started: list[Handle] = []
    while sched.step():
        for h in (h_none, h_late, h_soon, h_none2):
            if h.state is not LaneState.WAITING and h not in started:
                started.append(h)
    assert started == [h_soon, h_late, h_none, h_none2]
    sched.close()


def test_stop_ids_eos_and_length() -> None:
    p = [5, 6, 7, 8]
    ref = solo(p, 12)
    i = next(k for k in range(2, 12) if ref[k] not in ref[:k])
    with NativeScheduler(model(), eos_ids=(ref[i],)) as sched:
        eos = sched.admit(Request(p, max_new_tokens=12))
        no_eos = sched.admit(Request(p, max_new_tokens=12, stop_on_eos=False))
        stop = sched.admit(Request(p, max_new_tokens=12, stop_on_eos=False, stop_ids=(ref[i],)))
        short = sched.admit(Request(p, max_new_tokens=1))
        r_eos, r_no, r_stop, r_short = (h.result(timeout=60) for h in (eos, no_eos, stop, short))
    assert (r_eos.finish_reason, r_eos.token_ids) == (FinishReason.EOS, ref[:i])
    assert (r_stop.finish_reason, r_stop.token_ids) == (FinishReason.STOP, ref[:i])
    assert (r_no.finish_reason, r_no.token_ids) == (FinishReason.LENGTH, ref)
    assert (r_short.finish_reason, r_short.token_ids) == (FinishReason.LENGTH, ref[:1])


def test_seeded_sampling_does_not_depend_on_batch_mates() -> None:
    sp = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=123)
    p = [9, 8, 7, 6, 5]
    with NativeScheduler(model()) as sched:
        alone = sched.admit(Request(p, max_new_tokens=10, sampling=sp)).result(timeout=60).token_ids
    rng = np.random.default_rng(2)
    # batch mates with long prompts: their full chunks run the parallel kernels
    with ParallelLaunches() as launches, NativeScheduler(model()) as sched:
        others = [sched.admit(Request(rand_prompt(rng, n), max_new_tokens=15)) for n in (20, 150, 200)]
        mine = sched.admit(Request(p, max_new_tokens=10, sampling=sp))
        crowd = mine.result(timeout=60).token_ids
        [h.result(timeout=60) for h in others]
    assert alone == crowd and len(crowd) == 10
    launches.assert_multithreaded("fak-scheduler")


def _sampled_solo(prompt: list[int], n: int, sp: SamplingParams, penalties: bool = False) -> list[int]:
    """The request run alone on a plain Session, sampled step by step: with the engine's `Sampler`,
    or (penalties) with `sample` given the generated ids and the prompt, as the scheduler must."""
    s = Session(model())
    logits = s.prefill(prompt)  # shorter than one prefill chunk: the scheduler's rows are these rows
    sampler, rng, out = Sampler(sp), np.random.default_rng(sp.seed), []
    while len(out) < n:
        out.append(sample(logits, sp, rng, out, prompt) if penalties else sampler(logits))
        logits = s.step(out[-1])
    s.free()
    return out


def test_sampled_requests_follow_their_own_params_and_seed() -> None:
    """A sampled lane is the Sampler's sequence for its seed (not greedy, not its neighbour's seed)."""
    p = [9, 8, 7, 6, 5]
    sps = {"a": SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=123),
           "b": SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=124),
           "hot": SamplingParams(temperature=3.0, seed=123),
           "pen": SamplingParams(temperature=0.7, seed=5, repetition_penalty=1.5, presence_penalty=1.0,
                                 frequency_penalty=0.5, logit_bias={p[0]: 2.0})}
    with NativeScheduler(model()) as sched:
        hs = {k: sched.admit(Request(p, max_new_tokens=16, sampling=sp)) for k, sp in sps.items()}
        hs["greedy"] = sched.admit(Request(p, max_new_tokens=16))
        got = {k: h.result(timeout=60).token_ids for k, h in hs.items()}
    assert got["greedy"] == solo(p, 16)
    for k, sp in sps.items():
        assert got[k] == _sampled_solo(p, 16, sp, penalties=k == "pen"), k
        assert got[k] != got["greedy"], k
    assert got["a"] != got["b"]  # the seed matters
    assert got["a"] != got["hot"]  # and so does the temperature (same seed)


def test_cancel_frees_kv_between_steps() -> None:
    sched = NativeScheduler(model(), thread=False, prefix_cache=False, kv_blocks=32)
    h = sched.admit(Request(list(range(40)), max_new_tokens=200))
    other = sched.admit(Request([1, 2], max_new_tokens=200))
    for _ in range(5):
        sched.step()
    assert h.state is LaneState.DECODING and sched.pool.num_used > 0
    h.cancel()
    sched.step()
    r = h.result(0)
    assert r.finish_reason is FinishReason.CANCELLED and 0 < len(r.token_ids) < 200
    assert sched.pool.num_used == len(other._lane.session.kv.blocks) == 1  # type: ignore[attr-defined]
    other.cancel()
    sched.step()
    assert sched.pool.num_used == 0 and not sched.step()
    sched.close()


def test_close_aborts_everything_joins_and_rejects_admits() -> None:
    sched = NativeScheduler(model(), max_running=2, kv_blocks=16)
    hs = [sched.admit(Request(list(range(1, 30)), max_new_tokens=500)) for _ in range(5)]
    next(iter(hs[0]))  # the loop is running
    sched.close()
    assert not sched._thread.is_alive()  # type: ignore[union-attr]
    assert all(h.result(0).finish_reason is FinishReason.CANCELLED for h in hs)
    assert sched.pool.num_used == 0
    with pytest.raises(EngineError, match="closed"):
        sched.admit(Request([1], max_new_tokens=1))
    sched.close()  # idempotent
    assert sched._thread not in threading.enumerate()  # type: ignore[union-attr]


def test_lone_lane_that_cannot_fit_finishes_with_error_others_continue() -> None:
    with NativeScheduler(model(), kv_blocks=3, block_tokens=4, max_running=1) as sched:
        big = sched.admit(Request([1, 2, 3], max_new_tokens=30))
        small = sched.admit(Request([4, 5], max_new_tokens=3))
        rb, rs = big.result(timeout=60), small.result(timeout=60)
    assert rb.finish_reason is FinishReason.ERROR and "KV budget" in (rb.error or "")
    assert rb.token_ids == solo([1, 2, 3], len(rb.token_ids)) and len(rb.token_ids) == 12 - 3 + 1
    assert rs.finish_reason is FinishReason.LENGTH and rs.token_ids == solo([4, 5], 3)


@pytest.mark.parametrize(
    ("kwargs", "request_", "match"),
    [
        ({}, Request([]), "empty prompt"),
        ({}, Request([1, 256]), "outside the vocabulary"),
        ({}, Request([1], max_new_tokens=0), "max_new_tokens"),
        ({}, Request("hello"), "no tokenizer"),
        ({}, Request([1], stop_strings=("x",)), "stop strings need a tokenizer"),
        ({}, Request([1, 2], max_new_tokens=4095), "exceeds the context length 4096"),
        ({"kv_blocks": 2, "block_tokens": 4}, Request(list(range(8))), "needs 3 KV blocks, the budget is 2"),
    ],
)
def test_bad_requests_are_one_clear_error(kwargs: dict, request_: Request, match: str) -> None:
    with NativeScheduler(model(), **kwargs) as sched, pytest.raises(EngineError, match=match):
        sched.admit(request_)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"preempt": "drop"}, "unknown preempt mode"), ({"victim": "oldest"}, "unknown victim rule"),
     ({"max_running": -1}, "max_running"), ({"kv_blocks": 0}, "kv_blocks"), ({"prefill_chunk": 0}, "prefill_chunk"),
     ({"prefill_budget": 0}, "prefill_budget")],
)
def test_bad_config(kwargs: dict, match: str) -> None:
    with pytest.raises(EngineError, match=match):
        NativeScheduler(model(), **kwargs)


def test_lane_state_machine_rejects_illegal_moves() -> None:
    lane = Lane(Request([1]), 0, [1], Handle(Request([1]), "r", lambda h: None), 0.0)
    with pytest.raises(EngineError, match="waiting -> decoding"):
        lane.to(LaneState.DECODING)
    for s in (LaneState.PREFILLING, LaneState.PREEMPTED, LaneState.DECODING, LaneState.PREEMPTED,
              LaneState.FINISHED):
        lane.to(s)
    assert lane.handle.state is LaneState.FINISHED
    with pytest.raises(EngineError, match="finished -> waiting"):
        lane.to(LaneState.WAITING)


class _Latin1:
    """A byte-per-token stand-in for the tokenizer stream (text tracking is tokenizer-agnostic)."""

    eos_ids: tuple[int, ...] = ()

    def stream(self, skip_special: bool = False) -> object:
        class S:
            def push(self, t: int) -> str:
                return chr(t)

            def flush(self) -> str:
                return ""

        return S()


def test_text_tracker_holds_back_partial_stop_strings() -> None:
    tt = TextTracker(_Latin1(), ("xyz", "ab"))
    pieces = [tt.push(ord(c)) for c in "qxyqa"]
    assert "".join(pieces) == "qxyq" and pieces[1:3] == ["", ""]  # "x", "xy" held, released on "q"
    assert tt.push(ord("b")) == "" and tt.stopped and tt.text == "qxyq"
    tt2 = TextTracker(_Latin1(), ("zz",))
    out = "".join(tt2.push(ord(c)) for c in "az") + tt2.finish()
    assert out == tt2.text == "az" and not tt2.stopped


def test_stop_string_through_the_scheduler() -> None:
    p = [65, 66, 67]
    ref = solo(p, 10)
    text = "".join(chr(t) for t in ref)
    stop = text[4:6]
    cut = text.index(stop)
    with NativeScheduler(model(), tokenizer=_Latin1()) as sched:
        h = sched.admit(Request(p, max_new_tokens=10, stop_strings=(stop,)))
        pieces = list(h.pieces(timeout=60))
        r = h.result(timeout=60)
    assert r.finish_reason is FinishReason.STOP
    assert r.text == "".join(pieces) == text[:cut]


def test_forward_batch_equals_serial_steps_and_is_all_or_nothing() -> None:
    from engine.model.kv import KVExhausted
    from engine.model.session import Session, forward_batch

    m = model()
    p = rand_prompt(np.random.default_rng(12), 30)
    ref = Session(m)
    for t in p:
        want = ref.step(t)
    a, b = Session(m), Session(m)
    forward_batch([a, b], [p[:13], [7, 8]])
    got = forward_batch([b, a], [[9], p[13:]])[1]
    assert np.array_equal(got, want) and a.tokens == p and b.length == 3
    pool = m.new_pool(2, 4)
    x, y = Session(m, pool), Session(m, pool)
    x.prefill([1, 2, 3, 4, 5])
    with pytest.raises(KVExhausted):
        forward_batch([x, y], [[6], [1, 2]])  # y needs a block, none left
    assert (x.length, y.length, len(x.kv.blocks), pool.num_free) == (5, 0, 2, 0)


def test_lanes_admitted_together_compute_a_shared_prompt_once() -> None:
    rng = np.random.default_rng(13)
    system = rand_prompt(rng, 64)
    prompts = [system + rand_prompt(rng, 6) for _ in range(4)]
    with NativeScheduler(model(), thread=False) as sched:
        hs = [sched.admit(Request(p, max_new_tokens=5)) for p in prompts]
        while sched.step():
            pass
        st = sched.stats()
    assert st.prefill_tokens == 64 + 4 * 6 and st.prefix_hits == 3 and st.prefix_hit_tokens == 3 * 64
    assert [h.result(0).token_ids for h in hs] == [solo(p, 5) for p in prompts]


def test_a_model_failure_fails_the_lanes_and_the_loop_keeps_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    sched = NativeScheduler(model())
    real = sched._forward_batch
    calls = {"n": 0}

    def flaky(sessions, chunks, *rows, **out):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return real(sessions, chunks, *rows, **out)

    monkeypatch.setattr(sched, "_forward_batch", flaky)
    r = sched.admit(Request([1, 2, 3], max_new_tokens=3)).result(timeout=60)
    assert r.finish_reason is FinishReason.ERROR and r.error == "RuntimeError: boom"
    ok = sched.admit(Request([1, 2, 3], max_new_tokens=3)).result(timeout=60)
    assert ok.finish_reason is FinishReason.LENGTH and ok.token_ids == solo([1, 2, 3], 3)
    sched.close()
    assert sched.pool.num_used == 0


@pytest.mark.parametrize("kv_dtype", ["f16", "bf16"])
def test_a_half_width_kv_cache_keeps_batched_equal_to_alone(kv_dtype: str) -> None:
    """With K/V stored as f16 / bf16 (rounded once, on the way into the pool), a lane's tokens still do not
    depend on the batch: 6 concurrent requests give what each gives alone on a Session over the same dtype."""
    from engine.model.forward import Model

    base = model()
    m = Model(base.config, base.weights, name=f"synthetic-mix-{kv_dtype}")
    m.prefill_blas, m.kv_dtype = False, kv_dtype
    rng = np.random.default_rng(3)
    prompts = [rand_prompt(rng, n) for n in (3, 17, 40, 9, 150, 1)]

    def alone(p: list[int]) -> list[int]:
        s = Session(m)
        for i in range(0, len(p), 32):
            logits = s.prefill(p[i : i + 32])
        out = [int(np.argmax(logits))]
        while len(out) < 12:
            out.append(int(np.argmax(s.step(out[-1]))))
        assert s.pool.kv_dtype == kv_dtype
        return out

    with NativeScheduler(m, prefill_chunk=32) as sched:
        assert sched.pool.kv_dtype == kv_dtype and sched.pool.k.itemsize == 2
        results = [h.result(timeout=60) for h in [sched.admit(Request(p, max_new_tokens=12)) for p in prompts]]
    assert [r.token_ids for r in results] == [alone(p) for p in prompts]


def _spy_logits(sched: NativeScheduler) -> list[np.ndarray]:
    """Every logits array the scheduler's forwards return, in order."""
    real, seen = sched._forward_batch, []

    def spy(sessions, chunks, *rows, **out):  # type: ignore[no-untyped-def]
        logits = real(sessions, chunks, *rows, **out)
        seen.append(logits)
        return logits

    sched._forward_batch = spy  # type: ignore[method-assign]
    return seen


def test_every_steps_logits_land_in_one_reused_buffer() -> None:
    """The mixed step's logits are a view of the scheduler's scratch buffer, step after step (no fresh
    rows x vocabulary array each step: engine/model/scratch.py), and each step reads its own: the tokens
    are a lone run's, with and without drafts (a draft's rows share the buffer too)."""
    rng = np.random.default_rng(41)
    prompts = [rand_prompt(rng, n) for n in (5, 40, 9)]
    for mode in ("off", "ngram"):
        sched = NativeScheduler(model(), thread=False, prefill_chunk=32, speculative=mode)
        seen = _spy_logits(sched)
        hs = [sched.admit(Request(p + p, max_new_tokens=12)) for p in prompts]
        while sched.step():
            pass
        buf = sched._logits.take(1, 1)
        assert len(seen) > 10 and all(np.shares_memory(logits, buf) for logits in seen[-8:])
        assert [h.result(0).token_ids for h in hs] == [solo(p + p, 12, 32) for p in prompts]
        assert (sched.stats().spec_accepted > 0) == (mode == "ngram")
        sched.close()


def test_scratch_views_share_one_buffer_grown_when_short() -> None:
    from engine.model.scratch import Scratch

    s = Scratch()
    a = s.take(2, 3)
    a[:] = 7.0
    b = s.take(3, 2)  # same size: the same memory, what the last take wrote
    assert b.shape == (3, 2) and b.flags.c_contiguous and np.shares_memory(a, b) and (b == 7.0).all()
    c = s.take(4, 5)  # larger: a new buffer, the old views keep theirs
    assert s.nbytes == 4 * 5 * 4 and not np.shares_memory(a, c) and (a == 7.0).all()
    s.take(4, 6)  # a little more: half again, so the next little more fits
    assert s.nbytes == 30 * 4 and np.shares_memory(s.take(5, 6), s.take(1, 1))
