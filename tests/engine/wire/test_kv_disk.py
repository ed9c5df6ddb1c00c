"""KV on disk (engine/wire/kv_disk.py): a restarted scheduler maps a known prompt from disk and answers with
the same tokens; every damaged, foreign or out-of-scope file is refused, counted and deleted, and the
request still answers right; a full disk turns persistence off with one warning; tainted spans never land."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from engine.model.synthetic import synthetic_model
from engine.sched.lane import Request
from engine.sched.scheduler import NativeScheduler
from engine.wire.frame import KVLayout
from engine.wire.kv_disk import SUFFIX, KVDiskCache
from support.sched_helpers import model, rand_prompt

BT = 16


def _disk(root: Path, m=None, max_bytes: int = 1 << 30, warn=None) -> KVDiskCache:  # type: ignore[no-untyped-def]
    m = m or model()
    c = m.config
    return KVDiskCache(root, m.identity, KVLayout(c.n_layers, c.n_kv_heads, c.head_dim, BT, "<f4"), max_bytes, warn)


def _run(root: Path | None, prompt: list[int], m=None, **req) -> tuple[list[int], object]:  # type: ignore[no-untyped-def]
    """One scheduler life: answer `prompt` greedily, close (every queued block on disk), return tokens and stats."""
    m = m or model()
    sched = NativeScheduler(m, block_tokens=BT, thread=False, kv_disk=_disk(root, m) if root else None)
    h = sched.admit(Request(prompt, max_new_tokens=6, **req))
    while sched.step():
        pass
    tokens = h.result(0).token_ids
    sched.close()
    return tokens, sched.stats()


def _files(root: Path) -> list[Path]:
    return sorted(root.glob("*" + SUFFIX))


def test_restart_maps_the_prompt_from_disk_with_the_same_tokens(tmp_path: Path) -> None:
    prompt = rand_prompt(np.random.default_rng(1), 200)
    cold, st_cold = _run(None, prompt)
    first, st1 = _run(tmp_path, prompt)
    assert first == cold and st1.kv_disk_hits == 0 and st1.prefill_tokens == 200
    # the prompt's 12 full blocks, and the generated tokens' (200 + 6 - 1 fed = 205 -> 12 full blocks)
    assert len(_files(tmp_path)) == 12 and st1.kv_disk_bytes_written > 0
    again, st2 = _run(tmp_path, prompt)
    assert again == cold
    assert st2.kv_disk_hits == 12  # whole prefill chunks of 64: 192 tokens mapped from disk
    assert st2.prefill_tokens == 200 - 192 and st2.prefix_hit_tokens == 192
    assert st2.kv_disk_refused == 0 and st2.kv_disk_enabled == 1


def test_a_longer_prompt_reuses_the_shared_prefix_and_persists_the_rest(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    base = rand_prompt(rng, 130)
    _run(tmp_path, base)
    longer = base + rand_prompt(rng, 80)
    toks, st = _run(tmp_path, longer)
    assert toks == _run(None, longer)[0]
    assert st.prefix_hit_tokens == 128 and st.kv_disk_hits == 8


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "foreign-model", "wrong-chain", "garbage"])
def test_a_damaged_or_foreign_file_is_refused_counted_and_the_answer_is_right(tmp_path: Path, damage: str) -> None:
    prompt = rand_prompt(np.random.default_rng(3), 200)
    cold, _ = _run(tmp_path, prompt)
    files = _files(tmp_path)
    # the lookup walks the chain from block 0: damage the file of the 5th block it will look for
    from engine.sched.prefix_cache import chain_hashes

    d = _disk(tmp_path)
    target = tmp_path / (d.names(prompt, 5, "")[4].hex() + SUFFIX)
    d.close()
    assert target in files
    data = bytearray(target.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "bitflip":
        data[len(data) // 2] ^= 0x10
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    elif damage == "foreign-model":  # a frame written by another model's cache under this name
        other = synthetic_model(seed=7)
        od = _disk(tmp_path / "other", other)
        assert other.identity != model().identity
        _run_other = NativeScheduler(other, block_tokens=BT, thread=False, kv_disk=od)
        _run_other.admit(Request(prompt, max_new_tokens=1))
        while _run_other.step():
            pass
        _run_other.close()
        theirs = od.names(prompt, 5, "")[4].hex() + SUFFIX  # its own name for the same block
        data = bytearray((tmp_path / "other" / theirs).read_bytes())
    elif damage == "wrong-chain":  # a valid frame of this model, but another block's (renamed onto this one)
        data = bytearray((tmp_path / (d.names(prompt, 6, "")[5].hex() + SUFFIX)).read_bytes())
        assert chain_hashes(prompt, BT, 6)[5] != chain_hashes(prompt, BT, 5)[4]
    target.write_bytes(bytes(data))
    toks, st = _run(tmp_path, prompt)
    assert toks == cold
    assert st.kv_disk_refused == 1
    assert st.kv_disk_hits == 4  # blocks 0-3 loaded; the 5th refused; the lookup stopped there
    assert st.prefix_hit_tokens == 64  # whole chunks only: 4 blocks
    assert st.prefill_tokens == 200 - 64


def test_scopes_do_not_share_and_tainted_spans_are_never_written(tmp_path: Path) -> None:
    prompt = rand_prompt(np.random.default_rng(4), 100)
    _run(tmp_path, prompt, scope="alice")
    n = len(_files(tmp_path))
    assert n > 0
    toks, st = _run(tmp_path, prompt, scope="bob")
    assert st.kv_disk_hits == 0 and st.prefix_hit_tokens == 0  # another scope's names: never looked up
    assert len(_files(tmp_path)) == 2 * n  # bob's blocks are his own files
    _, st = _run(tmp_path, prompt, scope="alice")
    assert st.kv_disk_hits == 4
    before = set(_files(tmp_path))
    _run(tmp_path, rand_prompt(np.random.default_rng(5), 100), tainted=True)
    assert set(_files(tmp_path)) == before


def test_the_bound_evicts_least_recently_used_files(tmp_path: Path) -> None:
    m = model()
    sched = NativeScheduler(m, block_tokens=BT, thread=False, kv_disk=_disk(tmp_path, m, max_bytes=1))
    one = sched.kv_disk.layout.kv_bytes(1) * 2
    sched.close()
    d = _disk(tmp_path, m, max_bytes=5 * one + 4096)  # five block frames fit, a sixth does not
    sched = NativeScheduler(m, block_tokens=BT, thread=False, kv_disk=d)
    sched.admit(Request(rand_prompt(np.random.default_rng(6), 160), max_new_tokens=1))
    while sched.step():
        pass
    sched.close()
    st = sched.stats()
    assert st.kv_disk_files == len(_files(tmp_path)) <= 5 and st.kv_disk_evictions >= 5
    assert st.kv_disk_bytes == sum(f.stat().st_size for f in _files(tmp_path)) <= 5 * one + 4096


def test_a_half_written_file_is_never_read(tmp_path: Path) -> None:
    prompt = rand_prompt(np.random.default_rng(8), 100)
    _run(tmp_path, prompt)
    stray = tmp_path / ("ab" * 32 + ".123.tmp")
    stray.write_bytes(b"half a frame")
    d = _disk(tmp_path)
    assert not stray.exists()  # a temp left by a crash is removed at start, never indexed
    d.close()


def test_a_full_disk_turns_persistence_off_with_one_warning(tmp_path: Path) -> None:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root?)")
    try:
        warnings: list[str] = []
        m = model()
        sched = NativeScheduler(m, block_tokens=BT, thread=False, kv_disk=_disk(mnt, m, warn=warnings.append))
        prompt = rand_prompt(np.random.default_rng(9), 400)  # 25 blocks, far more than 128 KiB
        h = sched.admit(Request(prompt, max_new_tokens=4))
        while sched.step():
            pass
        toks = h.result(0).token_ids
        h2 = sched.admit(Request(rand_prompt(np.random.default_rng(10), 100), max_new_tokens=2))
        while sched.step():
            pass
        assert h2.result(0).token_ids
        sched.close()
        assert toks == _run(None, prompt)[0][:4]
        assert len(warnings) == 1 and "no longer persisted" in warnings[0], warnings
        assert sched.stats().kv_disk_enabled == 0
        assert not list(mnt.glob("*.tmp"))
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
