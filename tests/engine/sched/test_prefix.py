"""Prefix reuse: chained block hashes, refcounted sharing, LRU eviction, and a shared system prompt."""

from __future__ import annotations

import numpy as np

from engine.model.kv import BlockPool
from engine.sched.lane import FinishReason, Request
from engine.sched.prefix_cache import PrefixCache, chain_hashes
from engine.sched.scheduler import NativeScheduler
from support.sched_helpers import model, model_blas, rand_prompt, solo


def _pool(n: int = 8) -> BlockPool:
    return BlockPool(1, 1, 2, num_blocks=n, block_tokens=4)


def test_chain_hash_depends_on_every_earlier_block() -> None:
    a = chain_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, 2)
    b = chain_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4, 2)
    assert a[1] != b[1] and chain_hashes([1, 2, 3, 4], 4, 1) == a[:1]


def test_match_insert_refcounts_and_lru_eviction() -> None:
    pool = _pool()
    cache = PrefixCache(pool)
    toks = list(range(12))
    blocks = [pool.allocate() for _ in range(3)]
    cache.insert(toks, blocks, 3)
    assert [int(pool.refcount[b]) for b in blocks] == [2, 2, 2] and cache.reclaimable() == 0
    assert cache.match(toks, 11) == blocks[:2]  # max_tokens 11: two full blocks at most
    assert cache.match(toks[:4] + [99] * 8, 12) == blocks[:1]  # diverges in block 1
    assert cache.match([5] + toks[1:], 12) == []
    assert (cache.queries, cache.hits, cache.hit_tokens) == (3, 2, 12)
    assert cache.block_hits(blocks[0]) == 2 and cache.block_hits(blocks[2]) == 0
    for b in blocks[:2] + blocks[:1] + blocks:  # the matchers and the original owner let go
        pool.release(b)
    assert cache.reclaimable() == 3 and pool.num_used == 3
    # LRU evicts the leaf first (block 2 was never touched by a match), parents stay usable
    assert cache.evict(1) == 1 and cache.match(toks, 12) == blocks[:2]
    for b in blocks[:2]:
        pool.release(b)
    cache.clear()
    assert pool.num_used == 0 and len(cache) == 0


def test_referenced_blocks_are_never_evicted() -> None:
    pool = _pool()
    cache = PrefixCache(pool)
    blocks = [pool.allocate() for _ in range(2)]
    cache.insert(list(range(8)), blocks, 2)
    pool.release(blocks[1])  # the owner still holds block 0
    assert cache.evict(5) == 1 and int(pool.refcount[blocks[0]]) == 2
    assert cache.match(list(range(8)), 8) == [blocks[0]]


def test_shared_256_token_system_prompt_prefills_only_the_suffix() -> None:
    rng = np.random.default_rng(3)
    system = rand_prompt(rng, 256)
    q1, q2 = rand_prompt(rng, 21), rand_prompt(rng, 37)
    with NativeScheduler(model(), prefill_chunk=64) as sched:
        r1 = sched.admit(Request(system + q1, max_new_tokens=10)).result(timeout=60)
        before = sched.stats()
        r2 = sched.admit(Request(system + q2, max_new_tokens=10)).result(timeout=60)
        after = sched.stats()
    assert r1.prefix_hit_tokens == 0 and r2.prefix_hit_tokens == 256
    assert after.prefill_tokens - before.prefill_tokens == len(q2)
    assert after.prefix_hit_tokens - before.prefix_hit_tokens == 256 and after.prefix_hits == 1
    with NativeScheduler(model(), prefill_chunk=64, prefix_cache=False) as plain:
        p2 = plain.admit(Request(system + q2, max_new_tokens=10)).result(timeout=60)
    assert p2.prefix_hit_tokens == 0
    assert r2.token_ids == p2.token_ids == solo(system + q2, 10, 64)
    assert r1.token_ids == solo(system + q1, 10, 64)


def test_prompt_that_is_all_cached_still_prefills_its_last_token() -> None:
    p = list(range(1, 33))  # exactly two 16-token blocks
    with NativeScheduler(model(), prefill_chunk=16) as sched:
        a = sched.admit(Request(p, max_new_tokens=5)).result(timeout=60)
        b = sched.admit(Request(p, max_new_tokens=5)).result(timeout=60)
        st = sched.stats()
    assert b.prefix_hit_tokens == 16 and st.prefill_tokens == 32 + 16
    assert a.token_ids == b.token_ids == solo(p, 5)


def test_cached_blocks_are_reclaimed_under_budget_no_leak() -> None:
    rng = np.random.default_rng(4)
    with NativeScheduler(model(), kv_blocks=8, block_tokens=4, thread=False) as sched:
        for _ in range(6):  # each leaves 3-4 cached blocks behind; the budget is 8
            p = rand_prompt(rng, 14)
            h = sched.admit(Request(p, max_new_tokens=6))
            while sched.step():
                assert sched.pool.num_used <= 8
            r = h.result(0)
            assert r.finish_reason is FinishReason.LENGTH and r.token_ids == solo(p, 6)
        st = sched.stats()
        assert st.cached_blocks == st.reclaimable_blocks == st.used_blocks > 0
        assert sched.prefix is not None and sched.prefix.evictions > 0
    assert sched.pool.num_used == 0


def test_concurrent_lanes_share_prefix_blocks() -> None:
    rng = np.random.default_rng(6)
    system = rand_prompt(rng, 64)
    sched = NativeScheduler(model(), thread=False, prefill_chunk=64, max_running=1)
    first = sched.admit(Request(system + [1], max_new_tokens=40))
    while first.state.value != "decoding":
        sched.step()
    sched.max_running = 0  # let the others in while the first still runs
    hs = [sched.admit(Request(system + rand_prompt(rng, 5), max_new_tokens=4)) for _ in range(3)]
    sched.step()
    shared = sched._running[0].session.kv.blocks[:4]  # type: ignore[union-attr]
    assert all(int(sched.pool.refcount[b]) == 5 for b in shared)  # 4 lanes + the cache
    while sched.step():
        pass
    assert all(h.result(0).prefix_hit_tokens == 64 for h in hs)
    sched.close()
    assert sched.pool.num_used == 0


def test_growable_pool_caps_unreferenced_cached_blocks() -> None:
    """The prefix cache is bounded in bytes: 3.5 blocks' worth keeps 3 blocks."""
    rng = np.random.default_rng(9)
    block_bytes = model().new_pool(None, 4).block_bytes
    sched = NativeScheduler(model(), block_tokens=4, prefix_cache_bytes=block_bytes * 7 // 2, thread=False)
    assert sched.prefix_cache_blocks == 3
    for _ in range(4):
        sched.admit(Request(rand_prompt(rng, 13), max_new_tokens=2))
        while sched.step():
            pass
        assert len(sched.prefix) <= 3 and sched.pool.num_used == len(sched.prefix)  # type: ignore[arg-type]
    sched.close()
    assert sched.pool.num_used == 0


def _kv_after_prefill(sched: NativeScheduler, prompt: list[int], others: list[list[int]] = ()) -> np.ndarray:
    return _prefilled(sched, prompt, others)[0]


def _prefilled(sched: NativeScheduler, prompt: list[int], others: list[list[int]] = ()) -> tuple[np.ndarray, int]:
    """(the prompt's KV, every layer, once prefilled; prompt tokens it mapped from the prefix cache); closes sched."""
    for o in others:
        sched.admit(Request(o, max_new_tokens=3))
    h = sched.admit(Request(prompt, max_new_tokens=40))
    while h.state.value != "decoding":
        sched.step()
    kv = h._lane.session.kv  # type: ignore[attr-defined]
    out = np.stack([np.concatenate(kv.gather(layer, len(prompt))) for layer in range(sched.pool.n_layers)])
    hit = h._lane.prefix_hit_tokens  # type: ignore[attr-defined]
    sched.close()
    return out, hit


def _cached(prompts: list[list[int]]) -> NativeScheduler:
    """A BLAS-prefill scheduler (64-token chunks, 16-token blocks) that has run each prompt once."""
    sched = NativeScheduler(model_blas(), thread=False, prefill_chunk=64)
    for p in prompts:
        sched.admit(Request(p, max_new_tokens=2))
        while sched.step():
            pass
    return sched


def test_the_same_prompt_again_maps_its_row_stable_tail_bit_exact() -> None:
    """Full chunks run through BLAS, a prompt's last partial chunk through the row-stable kernels. The same
    prompt again (a retry, n copies of one request) maps its whole chunks and then its tail's full blocks,
    which it would compute with those same kernels: it prefills only the tokens past its last full block,
    and every KV bit is a cold run's. So does a shorter prompt whose tail starts in the same chunk."""
    rng = np.random.default_rng(31)
    p = rand_prompt(rng, 2 * 64 + 50)  # chunks 0-64, 64-128 (BLAS), tail 128-178 (blocks 8, 9, 10 full)
    for q, hit in ((p, 176), (p[:170], 160)):
        cold, cold_hit = _prefilled(NativeScheduler(model_blas(), thread=False, prefill_chunk=64), q)
        warm, warm_hit = _prefilled(_cached([p]), q)
        assert (cold_hit, warm_hit) == (0, hit)
        assert np.array_equal(cold, warm)


def test_tail_blocks_are_mapped_only_where_both_prompts_compute_them_alike() -> None:
    """A prompt that runs past a cached tail computes those positions in a full BLAS chunk, and a prompt
    whose tail starts there computes them row-stable where a longer one cached BLAS blocks: either way the
    cached blocks hold other bits, so the hit stops at the whole chunks and the KV is a cold run's."""
    rng = np.random.default_rng(32)
    p = rand_prompt(rng, 2 * 64 + 50)
    longer = p[:176] + rand_prompt(rng, 80)  # 256 tokens: chunk 128-192 is a full one
    for q, before in ((longer, p), (p, longer)):
        cold, _ = _prefilled(NativeScheduler(model_blas(), thread=False, prefill_chunk=64), q)
        warm, hit = _prefilled(_cached([before]), q)
        assert hit == 128
        assert np.array_equal(cold, warm)


def test_copies_of_one_prompt_admitted_together_compute_its_tail_once() -> None:
    """Four copies of a prompt in one batch: the first computes it, the others wait for its blocks (whole
    chunks, then the row-stable tail) and prefill only the two tokens past its last full block; every copy
    decodes what a lone run does."""
    rng = np.random.default_rng(33)
    p = rand_prompt(rng, 2 * 64 + 50)
    sched = NativeScheduler(model_blas(), thread=False, prefill_chunk=64)
    hs = [sched.admit(Request(p, max_new_tokens=6)) for _ in range(4)]
    while sched.step():
        pass
    res = [h.result(0) for h in hs]
    assert sorted(r.prefix_hit_tokens for r in res) == [0, 176, 176, 176]
    assert sched.stats().prefill_tokens == 178 + 3 * 2
    sched.close()
    with NativeScheduler(model_blas(), prefill_chunk=64, prefix_cache=False) as alone:
        ref = alone.admit(Request(p, max_new_tokens=6)).result(timeout=60).token_ids
    assert all(r.token_ids == ref for r in res)


def test_blas_chunks_give_the_same_kv_bits_with_or_without_cache_and_batch_mates() -> None:
    """Real models prefill with BLAS, whose rows differ from decode rows in the last bits. Full chunks go
    through BLAS and prefix hits are whole chunks, so every KV bit of a prompt is the same whether its
    prefix came from the cache, and whatever it was batched with."""
    rng = np.random.default_rng(21)
    system = rand_prompt(rng, 150)
    a, b = system + rand_prompt(rng, 30), system + rand_prompt(rng, 41)
    cold = _kv_after_prefill(NativeScheduler(model_blas(), thread=False, prefill_chunk=32), b)
    warm_sched = NativeScheduler(model_blas(), thread=False, prefill_chunk=32)
    h = warm_sched.admit(Request(a, max_new_tokens=2))
    while warm_sched.step():
        pass
    warm = _kv_after_prefill(warm_sched, b)
    crowd = _kv_after_prefill(NativeScheduler(model_blas(), thread=False, prefill_chunk=32), b,
                              [rand_prompt(rng, n) for n in (5, 70, 33)])
    assert h.result(0).prefix_hit_tokens == 0 and warm_sched.stats().prefix_hit_tokens == 128  # 4 chunks of 32
    assert np.array_equal(cold, warm) and np.array_equal(cold, crowd)


def test_next_turn_reuses_the_previous_reply_too() -> None:
    """A conversation: turn 2's prompt is turn 1's prompt + its reply + a new message. The finished
    lane's generated tokens are cached as well as its prompt, so turn 2 prefills only the new
    message and the partial block the reply ended in (the last generated token was never fed)."""
    rng = np.random.default_rng(5)
    p1, q = rand_prompt(rng, 40), rand_prompt(rng, 9)
    with NativeScheduler(model(), prefill_chunk=64) as sched:  # 16-token blocks
        r1 = sched.admit(Request(p1, max_new_tokens=30)).result(timeout=60)
        p2 = p1 + r1.token_ids + q
        before = sched.stats()
        r2 = sched.admit(Request(p2, max_new_tokens=8)).result(timeout=60)
        after = sched.stats()
    fed = len(p1) + len(r1.token_ids) - 1  # the last sampled token has no KV
    assert r2.prefix_hit_tokens == fed // 16 * 16 == 64 > len(p1) // 16 * 16
    assert after.prefill_tokens - before.prefill_tokens == len(p2) - 64
    assert r2.token_ids == solo(p2, 8, 64)  # reuse changes nothing in the output


def test_a_reused_reply_changes_the_next_turn_only_in_the_last_bits() -> None:
    """The reply's KV was computed by decode steps, a cold prefill computes it in BLAS chunks: with a
    real (BLAS) prefill the next turn's logits move in the last bits (measured 2.1e-6 in logprob), its
    tokens do not. Prompt-only reuse stays bit-exact (test_blas_chunks_give_the_same_kv_bits...)."""
    rng = np.random.default_rng(5)
    p1, q = rand_prompt(rng, 40), rand_prompt(rng, 9)
    with NativeScheduler(model_blas(), prefill_chunk=64) as sched:
        r1 = sched.admit(Request(p1, max_new_tokens=30)).result(timeout=60)
        p2 = p1 + r1.token_ids + q
        warm = sched.admit(Request(p2, max_new_tokens=16, logprobs=0)).result(timeout=60)
    with NativeScheduler(model_blas(), prefill_chunk=64) as sched:
        cold = sched.admit(Request(p2, max_new_tokens=16, logprobs=0)).result(timeout=60)
    assert warm.prefix_hit_tokens == 64 and cold.prefix_hit_tokens == 0
    assert warm.token_ids == cold.token_ids
    assert max(abs(a.logprob - b.logprob) for a, b in zip(warm.logprobs, cold.logprobs, strict=False)) < 1e-4


def test_a_short_prompts_tail_gives_way_to_a_longer_prompts_blas_blocks() -> None:
    """A short prompt's only chunk is partial: its blocks are row-stable. A longer prompt with the same start
    computes them through BLAS and takes their place in the cache (every longer prompt computes them so),
    its later blocks chained under its own: the same long prompt again maps all of it, bit-equal to a cold
    run, and the short prompt again, finding BLAS blocks where its tail runs, computes its own."""
    rng = np.random.default_rng(34)
    system = rand_prompt(rng, 48)
    short, long = system + rand_prompt(rng, 10), system + rand_prompt(rng, 130)  # 58 and 178 tokens
    for q, hit in ((long, 176), (short, 0)):
        cold, _ = _prefilled(NativeScheduler(model_blas(), thread=False, prefill_chunk=64), q)
        warm, warm_hit = _prefilled(_cached([short, long]), q)
        assert warm_hit == hit
        assert np.array_equal(cold, warm)
