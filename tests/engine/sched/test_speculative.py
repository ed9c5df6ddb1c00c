"""Speculative decoding in the scheduler (engine/sched/draft.py, OutputProcessor.after_verify): the drafts
change how many tokens a step emits, never which. Greedy and seeded lanes give the tokens they give without
speculation, with drafts right, wrong or mixed, under preemption, prefix hits, stops, grammars and cancel."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine import Session
from engine.errors import EngineError
from engine.model.sampling import Sampler, SamplingParams
from engine.sched.draft import LONG_N, MAX_N, Drafter, KeepRate, LaneDraft, SuffixStore, TokenLog
from engine.sched.lane import FinishReason, Request
from engine.sched.scheduler import NativeScheduler
from engine.sched.step_cost import ZEN4_QWEN, StepCosts, lane_groups, measure, rows_reach
from engine.tokenizer.tokenizer import ByteTokenizer
from support.sched_helpers import ScriptedDrafter, model, rand_prompt, run_to_end, solo, use_drafter


def _run(sched: NativeScheduler, reqs: list[Request], check: bool = True) -> list:  # type: ignore[type-arg]
    """Step a thread=False scheduler to the end; after every step each running lane holds exactly the
    blocks its length needs (a rejected draft's blocks went back)."""
    bt = sched.pool.block_tokens

    def blocks_fit(sched: NativeScheduler) -> None:
        for lane in sched._running:
            if lane.session is not None:
                assert len(lane.session.kv.blocks) == -(-lane.session.length // bt)
                assert len(lane.session.tokens) == lane.session.length

    return run_to_end(sched, reqs, blocks_fit if check else None)


def rated(kept: float, tried: float) -> LaneDraft:
    """A lane whose keep rate is kept / tried after short and long matches alike."""
    return LaneDraft(rates=(KeepRate(kept, tried), KeepRate(kept, tried)))


def _prompts(seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    base = rand_prompt(rng, 30)
    return [rand_prompt(rng, 5), base * 3, rand_prompt(rng, 40), base[:12] * 4 + [7], [1]]


# -- the drafters ---------------------------------------------------------------------------------
def test_token_log_finds_the_latest_longest_match() -> None:
    log = TokenLog([1, 2, 3, 9, 1, 2, 3, 4, 5, 7, 2, 3, 4, 6])
    # tail (.., 2, 3): the longest suffix seen is "7 2 3"? no: "1 2 3" twice, "2 3" thrice; tail 0 1 2 3
    assert log.match(np.array([0, 1, 2, 3]), 3) == (3, [4, 5, 7])  # "1 2 3" latest at 4..6, then 4 5 7
    assert log.match(np.array([8, 2, 3]), 2) == (2, [4, 6])  # "2 3" latest at 10..11
    assert log.match(np.array([5, 5]), 3) == (0, [])  # nothing
    assert log.match(np.array([3]), 3) == (0, [])  # one token is below MIN_N
    own = TokenLog([5, 6, 7, 5, 6])  # its own end: the match is the earlier "5 6", not itself
    assert own.match(own.tokens[-MAX_N:], 4, exclude_end=True) == (2, [7, 5, 6])
    run = TokenLog([4, 4, 4, 4])
    assert run.match(run.tokens, 4, exclude_end=True) == (3, [4])  # a run drafts its next token


def test_lane_groups_follow_the_tile_kernels_padding() -> None:
    assert [lane_groups(r) for r in (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 15, 17)] == [
        [1], [2], [4], [4], [4, 1], [8], [8], [8], [8, 1], [8, 4], [8, 4, 1], [8, 8], [8, 8, 1]]
    assert lane_groups(10) == [8, 2] and lane_groups(11) == [8, 4] and lane_groups(14) == [8, 8]
    c = StepCosts(small={1: 9.0, 2: 11.0, 4: 13.0, 8: 18.0}, passes={8: 16.0, 4: 8.0, 2: 5.0, 1: 3.5})
    assert [c(r) for r in (0, 1, 2, 3, 5, 7, 9, 10, 12, 16, 17)] == [
        0.0, 9.0, 11.0, 13.0, 16.5, 18.0, 21.5, 23.0, 26.0, 34.0, 37.5]
    # rows past the context the staircase was timed at add their attention: ms a row per 1000 positions
    far = StepCosts(small=c.small, passes=c.passes, attention=2.0, context=100)
    assert far(8, 8 * 100) == c(8) and far(1, 50) == c(1)  # at (or under) the timed context: the staircase
    assert far(8, 8 * 600) == pytest.approx(c(8) + 8.0) and far(17, 17 * 1100) == pytest.approx(c(17) + 34.0)
    assert rows_reach(100, 1) == 101 and rows_reach(100, 3) == 101 + 102 + 103 and rows_reach(0, 0) == 0
    lanes = StepCosts(small=c.small, passes=c.passes, lane=0.5)  # and each lane past the first its own share
    assert lanes(16, 0, 16) == pytest.approx(c(16) + 7.5) and lanes(16, 0, 1) == c(16) and lanes(16) == c(16)
    # from WIDE rows the timed wide steps: 16 rows at a time, the rest as passes (here cheaper than 2 x 16.0)
    wide = StepCosts(small=c.small, passes=c.passes, wide=(60.0, 20.0), attention=2.0, context=100)
    assert wide(31) == c(31) and wide(32) == 60.0 and wide(41) == 60.0 + 16.0 + 3.5
    # 15 rows past a group: two passes of 8 (32.0), capped at a group
    assert wide(47) == 60.0 + 20.0 and wide(63) == 60.0 + 20.0 + 20.0
    assert wide(64) == 100.0 and wide(80, 80 * 600) == pytest.approx(120.0 + 80.0)


def test_the_step_spends_its_rows_on_the_staircase() -> None:
    """Draft tokens are chosen by value (p^j) against what their rows cost: a lone lane at p = 0.85 drafts
    7 (8 rows, one pass), not 8 (a pass of 1 more); a batch of 16 adds no lone row (a third pass), drafts
    nothing where its rows are compute-bound, and whole passes of 8 where they are not; a lane cut to
    nothing checks its first token for free."""
    d = Drafter("ngram", 8)
    sure = rated(8.5, 10.0)  # 0.85
    draft = list(range(10, 18))
    assert d.choose([sure], [draft], [5], 1, ZEN4_QWEN) == [draft[:7]]
    unsure = rated(2.0, 10.0)  # 0.2: three rows for 0.25 tokens do not pay a 42% dearer step
    assert d.choose([unsure], [draft], [5], 1, ZEN4_QWEN) == [[]]
    assert unsure.shadow == (5, 10, False)
    # 16 rows on Zen 4 are compute-bound: a pass of 8 more costs what 8 more lanes' rows would give
    many = [rated(9.9, 10.0) for _ in range(16)]
    assert d.choose(many, [draft] * 16, [3] * 16, 16, ZEN4_QWEN) == [[]] * 16
    # a host whose rows are cheap beside the read of the weights (memory-bound to 32 rows)
    cheap = StepCosts(small={1: 9.0, 2: 9.5, 4: 10.0, 8: 11.0}, passes={8: 4.0, 4: 2.5, 2: 2.0, 1: 1.5})
    many = [rated(8.5, 10.0) for _ in range(16)]
    assert d.choose(many[:1], [draft[:1]], [3], 16, cheap, lanes=16) == [[]]  # one token against a third pass
    cut = d.choose(many, [draft] * 16, [3] * 16, 16, cheap)
    assert sum(map(len, cut)) % 8 == 0 and cut[0] and all(c == draft[:len(c)] for c in cut)  # whole passes
    assert max(map(len, cut)) - min(map(len, cut)) <= 1  # equal rates: the first tokens first, spread out
    # prefill rows are the step's work too: with 12 chunk rows (a lane) beside 4 decoders, a half pass does not pay
    assert d.choose([sure], [draft[:4]], [3], 16, ZEN4_QWEN, lanes=5) == [[]]
    assert d.choose([sure], [draft[:4]], [3], 1, ZEN4_QWEN) == [draft[:3]]  # alone: a pass of 4


def test_a_long_context_makes_draft_rows_dear() -> None:
    """Each draft row attends to its lane's whole context: at 4096 positions (~6 ms a row here) a lone lane
    at p = 0.85 drafts 3, not the 7 it drafts at a short context, and one at p = 0.5 nothing."""
    d = Drafter("ngram", 8)
    costs = StepCosts(small=ZEN4_QWEN.small, passes=ZEN4_QWEN.passes, attention=1.5, context=64)
    draft = list(range(10, 18))
    assert d.choose([rated(8.5, 10.0)], [draft], [5], 1, costs, [64], 64) == [draft[:7]]
    assert d.choose([rated(8.5, 10.0)], [draft], [5], 1, costs, [4096], 4096) == [draft[:3]]
    assert d.choose([rated(6.0, 10.0)], [draft], [5], 1, costs, [500], 500) == [draft[:3]]
    assert d.choose([rated(6.0, 10.0)], [draft], [5], 1, costs, [4096], 4096) == [[]]
    # without the lanes' contexts the attention is not counted (the staircase alone)
    assert d.choose([rated(8.5, 10.0)], [draft], [5], 1, costs) == [draft[:7]]



def test_a_lanes_first_row_reads_its_context_alone() -> None:
    """`first`: what a lane's first row adds per 1000 positions of its context on top of `attention` (its
    further rows share each key chunk). It is the lanes' (held), not the rows': drafts do not add it, so it
    makes the plain step dearer and the same draft rows cheaper beside it. 16 lanes of 2000 positions at
    p = 0.9: 32 draft rows without it, 64 with 1 ms a lane per 1000."""
    c = StepCosts(small=ZEN4_QWEN.small, passes=ZEN4_QWEN.passes, wide=(40.0, 14.0), attention=0.7, context=64,
                  lane=0.5)
    f = StepCosts(small=c.small, passes=c.passes, wide=c.wide, attention=0.7, context=64, lane=0.5, first=1.0)
    reach = 16 * 2000
    assert f(16, reach, 16) == c(16, reach, 16)  # no lanes' contexts given: not counted
    assert f(16, reach, 16, reach) == pytest.approx(c(16, reach, 16) + 16 * (2000 - 64) / 1000)
    assert f(32, 2 * reach, 16, reach) - f(16, reach, 16, reach) == pytest.approx(c(32, 2 * reach, 16) - c(16, reach, 16))
    assert f(1, 40, 1, 40) == c(1, 40, 1)  # under the timed context: the staircase
    d, draft = Drafter("ngram", 8), list(range(10, 18))
    many = [rated(9.0, 10.0) for _ in range(16)]
    without = d.choose(many, [draft] * 16, [3] * 16, 16, c, [2000] * 16, reach, 16, reach)
    with_first = d.choose(many, [draft] * 16, [3] * 16, 16, f, [2000] * 16, reach, 16, reach)
    assert sum(map(len, without)) == 32 and sum(map(len, with_first)) == 64

def test_many_lanes_make_the_step_dear_and_its_drafts_worth_more() -> None:
    """Each lane of a step costs its own share: 16 compute-bound rows at 2 ms a lane cost 63.8 ms, not 33.8,
    and at that price a pass of draft rows pays where alone it does not."""
    d = Drafter("ngram", 8)
    many = [rated(9.9, 10.0) for _ in range(16)]
    draft = list(range(10, 18))
    shared = StepCosts(small=ZEN4_QWEN.small, passes=ZEN4_QWEN.passes, lane=2.0)
    assert d.choose(many, [draft] * 16, [3] * 16, 16, shared, lanes=1) == [[]] * 16
    cut = d.choose(many, [draft] * 16, [3] * 16, 16, shared, lanes=16)
    assert sum(map(len, cut)) >= 64 and all(c == draft[:len(c)] for c in cut)


def test_the_fair_choice_never_slows_fifteen_lanes_for_one() -> None:
    """The choice weighs every lane's rate (the sum of log(1 + a lane's expected gain) against each lane's
    slower step), not the step's tokens per ms: one lane's sure draft does not buy rows that slow the 15
    lanes beside it, which the throughput choice does (on 16 lanes of stories it lost 4-10%: bench/spec.py);
    when every lane drafts, each lane's gain pays for its share and all draft; and the rows are spread: lanes
    with unsure drafts get their first tokens before sure lanes get their last."""
    shared = StepCosts(small=ZEN4_QWEN.small, passes=ZEN4_QWEN.passes, lane=2.0)
    draft = list(range(10, 18))
    fair, thru = Drafter("ngram", 8), Drafter("ngram", 8)
    thru.FAIR = False
    assert fair.FAIR
    assert thru.choose([rated(9.9, 10.0)], [draft], [3], 16, shared, lanes=16) == [draft]
    assert fair.choose([rated(9.9, 10.0)], [draft], [3], 16, shared, lanes=16) == [[]]
    every = [rated(9.9, 10.0) for _ in range(16)]
    assert fair.choose(every, [draft] * 16, [3] * 16, 16, shared, lanes=16) == [draft] * 16
    mixed = [rated(9.9, 10.0) for _ in range(8)] + [rated(6.0, 10.0) for _ in range(8)]
    assert list(map(len, thru.choose(mixed, [draft] * 16, [3] * 16, 16, shared, lanes=16))) == [8] * 8 + [0] * 8
    assert list(map(len, fair.choose(mixed, [draft] * 16, [3] * 16, 16, shared, lanes=16))) == [3] * 8 + [1] * 8
    # one lane alone: the same choice either way (its rate is the step's)
    for p in (2.0, 6.0, 8.5, 9.9):
        assert fair.choose([rated(p, 10.0)], [draft], [5], 1, ZEN4_QWEN) == thru.choose([rated(p, 10.0)], [draft], [5],
                                                                                        1, ZEN4_QWEN)


def test_the_attention_term_is_what_far_rows_add(monkeypatch: pytest.MonkeyPatch) -> None:
    """measure() times 8 rows at its context and again `far` positions on: the difference per row and
    position is the attention term; 4 lanes of a row against a lane of 4 rows, the lane term (a clock the
    fake forward advances: 1 us a row per position held, 0.5 ms a lane past the first)."""
    import types

    import engine.model.session as session_mod
    from engine.sched import step_cost

    now = [0.0]

    def fake_forward(sessions, chunks, counts, out=None):  # type: ignore[no-untyped-def]
        now[0] += 1e-3 * (2 + sum(counts)) + 0.5e-3 * (len(sessions) - 1)
        now[0] += 1e-6 * sum(n * s.length for n, s in zip(counts, sessions, strict=True))

    monkeypatch.setattr(session_mod, "forward_batch", fake_forward)
    monkeypatch.setattr(step_cost, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    cost = measure(model(), context=40, reps=1, far=500)
    assert cost.context == 40 and cost.attention == pytest.approx(1.0) and cost.lane == pytest.approx(0.5)
    assert cost.small[1] == pytest.approx(3.04) and cost.passes[8] == pytest.approx(8 * 1.04)
    assert cost.wide == pytest.approx((2 + 32 * 1.04, 16 * 1.04))  # 32 rows, and what each 16 more add


def test_step_costs_are_measured_on_the_model_at_warm_up() -> None:
    m = model()
    cost = measure(m, context=24, reps=1)
    assert measure(m) is cost  # once per model: the schedulers sharing it share the figures
    assert 0 < cost(1) <= cost(2) <= cost(4) <= cost(8) and all(v > 0 for v in cost.passes.values())
    assert set(cost.small) == {1, 2, 4, 8} and set(cost.passes) == {1, 2, 4, 8}
    assert cost.first >= 0.0 and cost.attention >= 0.0
    assert cost(17) == pytest.approx(cost(16) + cost.passes[1]) and cost(24) > cost(16)
    sched = NativeScheduler(m, speculative="ngram", thread=False, warm=True)
    assert sched.step_costs is cost
    assert NativeScheduler(m, speculative="off", thread=False).step_costs is ZEN4_QWEN  # no drafts, no timing


def test_shadows_and_verifications_teach_the_keep_rate_and_misses_cool_down() -> None:
    d, st = Drafter("ngram", 8), LaneDraft()
    prompt = [1, 2, 3, 1, 2]
    assert d.propose(st, prompt, [], None) == [3, 1, 2]
    rate = st.keep_rate
    st.shadow = (0, 3, False)
    d.propose(st, prompt, [3], None)  # the token after was the shadowed one: kept
    assert st.shadow is None and st.keep_rate > rate
    rate = st.keep_rate
    st.shadow = (1, 9, False)
    d.propose(st, prompt, [3, 1], None)
    assert st.keep_rate < rate
    d.verified(st, 4, 4)
    assert st.misses == 0
    for _ in range(3):
        d.verified(st, 3, 0)
    assert st.cooldown == 8 and st.pause == 16  # paused; the next pause twice as long
    assert [d.propose(st, prompt, [], None) for _ in range(8)] == [[]] * 8
    assert d.propose(st, prompt, [], None) != []  # drafting again
    for _ in range(3):
        d.verified(st, 1, 0)
    assert st.cooldown == 16 and st.pause == 32
    d.verified(st, 1, 1)
    assert st.pause == 8  # a kept token: back to short pauses
    # drafts never chosen (not worth their rows) miss as shadows: three in a row pause the lookups too
    for i in range(3):
        st.shadow = (i, 9, False)
        d.propose(st, prompt, [3] * (i + 1), None)
    assert st.cooldown == 8 - 1 and st.pause == 16  # paused (this propose was its first step)


def test_long_and_short_matches_keep_their_own_rates() -> None:
    """A draft after a match of LONG_N tokens or more learns and is priced by the long-match rate: misses
    after short matches (new text) do not hold back the drafts of a copied file, and the reverse."""
    d, st = Drafter("ngram", 8), LaneDraft()
    prompt = list(range(10, 30)) + list(range(10, 10 + LONG_N))  # its tail repeats LONG_N tokens
    assert d.propose(st, prompt, [], None)[:2] == [10 + LONG_N, 11 + LONG_N] and st.long
    long0, short0 = st.rates[True].rate, st.rates[False].rate
    d.verified(st, 8, 8)
    assert st.rates[True].rate > long0 and st.rates[False].rate == short0
    short = [40, 41, 50, 40, 41]  # then the output's tail repeats 2 tokens
    assert d.propose(st, prompt, short, None) == [50, 40, 41] and not st.long
    assert st.keep_rate == short0  # priced by its own kind
    for _ in range(2):
        d.verified(st, 3, 0)
    assert st.rates[False].rate < short0 and st.rates[True].rate > long0
    long1, short1 = st.rates[True].rate, st.rates[False].rate
    st.shadow = (len(short), 7, True)  # a shadow learns into the kind it was drafted after, not the current one
    d.propose(st, prompt, [*short, 9], None)  # 9, not 7: missed
    assert st.shadow is None and st.rates[True].rate < long1 and st.rates[False].rate == short1


def test_suffix_store_keeps_scopes_apart_and_drops_the_oldest() -> None:
    store = SuffixStore(capacity_tokens=10)
    store.add("a", [1, 2, 3, 4, 5, 6])
    assert store.match("a", np.array([9, 2, 3]), 2) == (2, [4, 5])
    assert store.match("b", np.array([9, 2, 3]), 2) == (0, [])  # another scope never sees it
    store.add("a", [7, 8, 9, 10, 11])  # 11 tokens > 10: the oldest goes
    assert store.match("a", np.array([2, 3]), 2) == (0, [])
    assert store.match("a", np.array([8, 9]), 2) == (2, [10, 11])
    d = Drafter("suffix", 4, store)
    assert d.propose(LaneDraft(), [50, 8, 9], [], "a") == [10, 11]  # the lane has no match: the store's
    assert d.propose(LaneDraft(), [50, 8, 9], [], "b") == []


def test_suffix_store_entries_never_run_into_each_other() -> None:
    """A scope's entries share one log: a match never spans two of them, a draft stops where its entry
    ends, an entry's last token drafts nothing, and of equal matches the latest entry's wins."""
    store = SuffixStore()
    for ids in ([1, 2, 3, 4], [7, 8, 1], [5, 6, 7], [7, 8, 2]):
        store.add("a", ids)
    assert store.match("a", np.array([1, 2]), 8) == (2, [3, 4])  # not on into [7, 8, 1]
    assert store.match("a", np.array([3, 4]), 8) == (0, [])  # an entry's end: nothing follows it
    assert store.match("a", np.array([4, 7]), 8) == (0, [])  # 4 ends one entry, 7 starts the next
    assert store.match("a", np.array([7, 8]), 8) == (2, [2])  # [7, 8, 1] and [7, 8, 2]: the latest
    assert store.match("a", np.array([6, 7, 8]), 8) == (2, [2])


def test_bad_settings_are_refused() -> None:
    with pytest.raises(EngineError, match="speculative must be one of off, ngram, suffix, got 'eagle'"):
        NativeScheduler(model(), speculative="eagle", thread=False)
    with pytest.raises(EngineError, match="spec_tokens must be >= 1, got 0"):
        NativeScheduler(model(), speculative="ngram", spec_tokens=0, thread=False)


def test_the_mode_switches_between_steps() -> None:
    """set_speculative: off -> ngram -> off on one scheduler, a lane in flight across each switch; the tokens
    are the unspeculated ones, drafts are verified only while a drafting mode is on; bad settings refused
    and the mode left as it was. On a threaded scheduler the switch runs on its loop thread."""
    prompts = _prompts()
    sched = NativeScheduler(model(), prefill_chunk=32, speculative="off", thread=False)
    hs = [sched.admit(Request(p, max_new_tokens=48)) for p in prompts]
    for _ in range(4):
        sched.step()
    assert sched.stats().spec_drafted == 0
    sched.set_speculative("ngram", 6)
    assert sched.speculative == "ngram" and sched.drafter is not None and sched.drafter.max_tokens == 6
    for _ in range(12):
        sched.step()
    drafted = sched.stats().spec_drafted
    assert drafted > 0
    sched.set_speculative("off")
    assert sched.drafter is None and sched.output.drafter is None
    while sched.step():
        pass
    assert sched.stats().spec_drafted == drafted
    for p, h in zip(prompts, hs, strict=True):
        assert h.result(0).token_ids == solo(p, 48, 32)
    with pytest.raises(EngineError, match="speculative must be one of off, ngram, suffix, got 'eagle'"):
        sched.set_speculative("eagle")
    with pytest.raises(EngineError, match="spec_tokens must be >= 1, got 0"):
        sched.set_speculative("ngram", 0)
    assert sched.speculative == "off" and sched.drafter is None
    sched.close()
    with NativeScheduler(model(), speculative="off", spec_tokens=5) as threaded:
        threaded.set_speculative("suffix")  # the longest draft the scheduler was built with
        assert threaded.speculative == "suffix" and threaded.drafter is not None and threaded.drafter.max_tokens == 5
        assert threaded.drafter.store is not None
        r = threaded.admit(Request(prompts[1], max_new_tokens=24)).result(60)
        assert r.token_ids == solo(prompts[1], 24, 32) and threaded.stats().spec_drafted > 0


# -- greedy identity ------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["ngram", "suffix"])
def test_greedy_tokens_equal_without_speculation(mode: str) -> None:
    prompts = _prompts()
    sched = NativeScheduler(model(), prefill_chunk=32, speculative=mode, thread=False)
    res = _run(sched, [Request(p, max_new_tokens=48) for p in prompts])
    for p, r in zip(prompts, res, strict=True):
        assert r.finish_reason is FinishReason.LENGTH and r.token_ids == solo(p, 48, 32)
    st = sched.stats()
    assert st.spec_accepted > 10 and st.spec_drafted > st.spec_accepted  # drafts kept and drafts rejected
    assert st.spec_emitted == st.spec_accepted + st.spec_lane_steps  # each drafting step: kept + the next
    sched.close()
    assert sched.pool.num_used == 0


@pytest.mark.parametrize("wrong_every", [0, 1, 2, 3])
def test_scripted_drafts_right_wrong_and_mixed(wrong_every: int) -> None:
    """Right drafts are all kept, always-wrong ones none, mixed ones up to the first wrong token; the
    tokens never change."""
    prompts = _prompts(1)
    answers = {tuple(p): solo(p, 40, 16) for p in prompts}
    sched = use_drafter(NativeScheduler(model(), prefill_chunk=16, speculative="ngram", thread=False,
                                        prefix_cache=False), ScriptedDrafter(answers, k=5, wrong_every=wrong_every))
    res = _run(sched, [Request(p, max_new_tokens=40) for p in prompts])
    assert [r.token_ids for r in res] == [answers[tuple(p)] for p in prompts]
    st = sched.stats()
    assert st.spec_drafted > 0
    if wrong_every == 1:
        assert st.spec_accepted == 0 and st.spec_emitted == st.spec_lane_steps
    elif wrong_every == 0:
        assert st.spec_accepted == st.spec_drafted  # every draft kept (the last ones cut to what is left)
        assert st.spec_emitted == 5 * 39  # every token after each lane's first came from a drafting step
        assert st.spec_lane_steps == 5 * math.ceil(39 / 6)  # six tokens a step: the pending one's and 5 drafted
    else:
        assert 0 < st.spec_accepted < st.spec_drafted
    assert sched.pool.num_used == 0  # no prefix cache: every block back


def test_max_new_tokens_stop_ids_and_eos_inside_a_draft() -> None:
    p = _prompts(2)[1]
    want = solo(p, 30, 16)
    answers = {tuple(p): want}
    for req, n in ((Request(p, max_new_tokens=7), 7),  # the length ends inside a right draft
                   (Request(p, max_new_tokens=30, stop_ids=(want[9],)), 9),  # a stop id inside one
                   (Request(p, max_new_tokens=30, stop_on_eos=True), 30)):
        sched = use_drafter(NativeScheduler(model(), prefill_chunk=16, speculative="ngram", thread=False,
                                            prefix_cache=False), ScriptedDrafter(answers, k=8, wrong_every=0))
        (r,) = _run(sched, [req])
        first = want.index(want[9]) if req.stop_ids else n
        assert r.token_ids == want[:min(n, first)]
        assert sched.pool.num_used == 0
    eos = NativeScheduler(model(), prefill_chunk=16, speculative="ngram", thread=False, prefix_cache=False,
                          eos_ids=(want[5],))
    use_drafter(eos, ScriptedDrafter(answers, k=8, wrong_every=0))
    (r,) = _run(eos, [Request(p, max_new_tokens=30)])
    assert r.finish_reason is FinishReason.EOS and r.token_ids == want[:want.index(want[5])]


def test_stop_strings_and_logprobs_with_speculation() -> None:
    tok = ByteTokenizer()
    p = _prompts(3)[1]
    plain = NativeScheduler(model(), tokenizer=tok, prefill_chunk=16, thread=False)
    (ref,) = _run(plain, [Request(p, max_new_tokens=40, logprobs=2)])
    stop = ref.text[12:15]
    (ref_stop,) = _run(plain, [Request(p, max_new_tokens=40, stop_strings=(stop,))])
    answers = {tuple(p): ref.token_ids}
    spec = use_drafter(NativeScheduler(model(), tokenizer=tok, prefill_chunk=16, speculative="ngram", thread=False),
                       ScriptedDrafter(answers, k=6, wrong_every=4))
    (a,) = _run(spec, [Request(p, max_new_tokens=40, logprobs=2)])
    (b,) = _run(spec, [Request(p, max_new_tokens=40, stop_strings=(stop,))])
    assert a.token_ids == ref.token_ids and a.logprobs == ref.logprobs and a.text == ref.text
    assert b.token_ids == ref_stop.token_ids and b.text == ref_stop.text and b.finish_reason is FinishReason.STOP


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_with_speculation(mode: str) -> None:
    rng = np.random.default_rng(11)
    prompts = [rand_prompt(rng, int(n)) for n in rng.integers(4, 40, size=8)]
    answers = {tuple(p): solo(p, 24, 16) for p in prompts}
    sched = NativeScheduler(model(), max_running=6, kv_blocks=18, block_tokens=4, preempt=mode, prefill_chunk=16,
                            thread=False, speculative="ngram")
    use_drafter(sched, ScriptedDrafter(answers, k=4, wrong_every=3))
    hs = [sched.admit(Request(p, max_new_tokens=24)) for p in prompts]
    while sched.step():
        assert sched.pool.num_used <= 18
    res = [h.result(0) for h in hs]
    st = sched.stats()
    assert (st.preemptions_swap if mode == "swap" else st.preemptions_recompute) >= 2
    assert st.spec_accepted > 0
    assert [r.token_ids for r in res] == [answers[tuple(p)] for p in prompts]


def test_prefix_hits_with_speculation() -> None:
    p = _prompts(4)[2] * 2
    sched = NativeScheduler(model(), prefill_chunk=16, speculative="ngram", thread=False)
    first = _run(sched, [Request(p, max_new_tokens=32)])[0]
    again = _run(sched, [Request(p, max_new_tokens=32), Request(p + first.token_ids[:20], max_new_tokens=16)])
    assert again[0].prefix_hit_tokens > 0 and again[1].prefix_hit_tokens > 0
    assert first.token_ids == again[0].token_ids == solo(p, 32, 16)
    assert again[1].token_ids == solo(p + first.token_ids[:20], 16, 16)


def test_cancel_mid_draft_frees_the_lane() -> None:
    prompts = _prompts(5)
    answers = {tuple(p): solo(p, 40, 16) for p in prompts}
    sched = use_drafter(NativeScheduler(model(), prefill_chunk=16, speculative="ngram", thread=False,
                                        prefix_cache=False), ScriptedDrafter(answers, k=6, wrong_every=0))
    hs = [sched.admit(Request(p, max_new_tokens=40)) for p in prompts]
    steps = 0
    while len(hs[1]._lane.generated) < 6:  # type: ignore[attr-defined]
        sched.step()
        steps += 1
    hs[1].cancel()
    while sched.step():
        pass
    r = hs[1].result(0)
    assert r.finish_reason is FinishReason.CANCELLED and r.token_ids == answers[tuple(prompts[1])][:len(r.token_ids)]
    assert 6 <= len(r.token_ids) < 40 and sched.stats().spec_accepted > 0
    for i in (0, 2, 3, 4):
        assert hs[i].result(0).token_ids == answers[tuple(prompts[i])]
    assert sched.pool.num_used == 0


def test_grammar_lanes_with_speculation() -> None:
    from engine.grammar import GrammarSpec

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["name", "n"], "additionalProperties": False}
    reqs = [Request(p, max_new_tokens=80, grammar=GrammarSpec.json_schema(schema, (", ", ": ")),
                    sampling=SamplingParams(logit_bias={ord('"'): 8.0, ord("}"): 4.0})) for p in _prompts(6)[:3]]
    tok = ByteTokenizer()
    ref = _run(NativeScheduler(model(), tokenizer=tok, thread=False), reqs)
    answers = {tuple(r.prompt): x.token_ids for r, x in zip(reqs, ref, strict=True)}  # type: ignore[arg-type]
    spec = use_drafter(NativeScheduler(model(), tokenizer=tok, speculative="ngram", thread=False),
                       ScriptedDrafter(answers, k=5, wrong_every=3))
    got = _run(spec, reqs)
    assert [g.token_ids for g in got] == [x.token_ids for x in ref]
    assert all(g.finish_reason is FinishReason.STOP for g in got) and spec.stats().spec_accepted > 0


def test_a_tainted_or_other_scope_output_never_drafts_for_another() -> None:
    p = _prompts(7)[2]
    sched = NativeScheduler(model(), prefill_chunk=16, speculative="suffix", thread=False)
    _run(sched, [Request(p, max_new_tokens=24, scope="alice"), Request(p[:9], max_new_tokens=24, tainted=True)])
    store = sched.drafter.store  # type: ignore[union-attr]
    assert set(store._logs) == {"alice"}  # the tainted request's output was not kept
    out = _run(sched, [Request(p, max_new_tokens=24, scope="bob")])[0]
    assert out.token_ids == solo(p, 24, 16)


# -- sampling -------------------------------------------------------------------------------------
def test_seeded_sampling_gives_the_unspeculated_tokens() -> None:
    """Each row is drawn as the one-token step would draw it (same logits, same rng): the same tokens."""
    prompts = _prompts(8)
    sps = [SamplingParams(temperature=t, top_k=k, top_p=tp, seed=s)
           for s, (t, k, tp) in enumerate([(1.0, 0, 1.0), (0.8, 40, 0.95), (1.5, 0, 0.9), (0.6, 8, 1.0),
                                           (1.0, 0, 1.0)])]
    reqs = [Request(p, max_new_tokens=32, sampling=sp) for p, sp in zip(prompts, sps, strict=True)]
    ref = _run(NativeScheduler(model(), prefill_chunk=16, thread=False), reqs)
    answers = {tuple(r.prompt): x.token_ids for r, x in zip(reqs, ref, strict=True)}  # type: ignore[arg-type]
    spec = use_drafter(NativeScheduler(model(), prefill_chunk=16, speculative="ngram", thread=False),
                       ScriptedDrafter(answers, k=4, wrong_every=3))
    assert [g.token_ids for g in _run(spec, reqs)] == [x.token_ids for x in ref]
    assert spec.stats().spec_accepted > 0


def test_a_sampled_draft_is_kept_with_the_models_probability() -> None:
    """The acceptance rule, counted: a draft token d proposed after the first one is kept in a fraction
    of seeds that matches p(d) under the lane's sampling distribution (binomial, 4.5 sigma)."""
    p = _prompts(9)[0]
    s = Session(model())
    first_logits = s.prefill(p)
    s.free()
    seeds = 400
    kept, expect = 0, 0.0
    for seed in range(seeds):
        sp = SamplingParams(temperature=1.3, seed=seed)
        t0 = Sampler(sp)(first_logits)  # what the lane emits first (its prefill's draw)
        probs = _softmax(_step_logits(p, t0), 1.3)  # the distribution of the token after it
        d = int(np.argsort(probs)[-2])  # the second most likely: kept sometimes, not always
        sched = use_drafter(NativeScheduler(model(), prefill_chunk=16, speculative="ngram", thread=False,
                                            prefix_cache=False), _Fixed(d))
        (r,) = _run(sched, [Request(p, max_new_tokens=3, sampling=sp)], check=False)
        assert r.token_ids[0] == t0 and sched.stats().spec_drafted == 1
        kept += sched.stats().spec_accepted
        expect += float(probs[d])
    var = expect * (1 - expect / seeds)
    assert abs(kept - expect) <= 4.5 * math.sqrt(var) + 1, (kept, expect)
    assert 0 < kept < seeds


class _Fixed(Drafter):
    """Drafts one fixed token after the first emitted one."""

    def __init__(self, token: int) -> None:
        super().__init__("ngram", 1)
        self.token = token

    def propose(self, state, prompt, generated, scope):  # type: ignore[no-untyped-def]
        return [self.token] if len(generated) == 1 else []

    def choose(self, states, drafts, generated, base_rows, cost, positions=None, base_positions=0, lanes=1, held=0):  # type: ignore[no-untyped-def]
        return drafts  # the test verifies this one token, whatever it costs


def _step_logits(p: list[int], t0: int) -> np.ndarray:
    s = Session(model())
    s.prefill(p)
    out = s.step(t0)
    s.free()
    return out


def _softmax(z: np.ndarray, temperature: float) -> np.ndarray:
    x = z.astype(np.float64) / temperature
    e = np.exp(x - x.max())
    return e / e.sum()
