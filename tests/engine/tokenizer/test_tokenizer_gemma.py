"""Gemma 3 270M's embedded tokenizer: HF transformers oracle, chat format, cache, streaming."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine.tokenizer.cache as C
import engine.tokenizer.tokenizer as T
from engine.errors import EngineError
from engine.gguf.aliases import resolve_model
from engine.tokenizer.tokenizer import GGUFTokenizer
from support.vocab import MIXED, no_gguf_vocab, read_cases, vocab_dir

pytestmark = [pytest.mark.gemma, pytest.mark.slow]

@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("tokcache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FAK_TOKENIZER_CACHE", str(d))
        yield d


@pytest.fixture(scope="module")
def tok(cache_dir: Path) -> GGUFTokenizer:
    T.clear_memo()  # a tokenizer memoised by an earlier module was cached elsewhere: build into cache_dir
    t = T.load_tokenizer("gemma3-270m")
    assert isinstance(t, GGUFTokenizer)
    return t


@pytest.fixture(scope="module")
def hf_tok():  # type: ignore[no-untyped-def]
    from support.hf_gguf import tokenizer

    return tokenizer(resolve_model("gemma3-270m"))


def _vector_texts() -> list[str]:

    spm = vocab_dir() / "ggml-vocab-llama-spm.gguf"
    assert spm.exists(), f"{spm}: llama.cpp's SentencePiece test vectors are missing (set FAK_VOCAB_DIR)"
    texts = [t for t, _ in read_cases(spm)]
    assert len(texts) > 20
    return texts


@pytest.mark.oracle
def test_matches_hf_transformers_on_mixed_text(tok: GGUFTokenizer, hf_tok) -> None:  # type: ignore[no-untyped-def]
    ids = tok.encode(MIXED, add_special=False)
    assert ids == hf_tok.encode(MIXED, add_special_tokens=False)
    assert tok.encode(MIXED) == hf_tok.encode(MIXED)  # with BOS, as the model wants
    assert tok.encode(MIXED)[0] == tok.bos_id == 2
    assert tok.decode(ids) == hf_tok.decode(ids) == MIXED
    for text in _vector_texts():
        assert tok.encode(text, add_special=False) == hf_tok.encode(text, add_special_tokens=False), text
    chat = "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n"
    assert tok.encode(chat, add_special=False, parse_special=True) == hf_tok.encode(chat, add_special_tokens=False)


def test_round_trip_and_special_handling(tok: GGUFTokenizer) -> None:
    assert tok.decode(tok.encode(MIXED, add_special=False)) == MIXED
    assert tok.decode(tok.encode(MIXED)) == "<bos>" + MIXED
    assert tok.decode(tok.encode(MIXED), skip_special=True) == MIXED
    turn = "<start_of_turn>user\nhi<end_of_turn>"
    assert tok.encode(turn, add_special=False, parse_special=True) == [105, 2364, 107, 2202, 106]
    plain = tok.encode(turn, add_special=False)
    assert 105 not in plain and 106 not in plain and tok.decode(plain) == turn
    assert tok.vocab_size == 262144
    assert tok.token_text(106) == "<end_of_turn>"
    assert tok.eos_ids[0] == 1 and 106 in tok.eos_ids
    with pytest.raises(EngineError, match="out of range"):
        tok.decode([262144])


def test_gemma_chat_template_fallback(tok: GGUFTokenizer) -> None:
    assert tok.info.chat_template is None  # the GGUF has none: Gemma turn format built in
    msgs = [{"role": "system", "content": "Be helpful."}, {"role": "user", "content": "Hello"}]
    assert tok.apply_chat_template(msgs) == (
        "<bos><start_of_turn>user\nBe helpful.\n\nHello<end_of_turn>\n<start_of_turn>model\n")
    convo = [{"role": "user", "content": "  Hi  "}, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": "Bye"}]
    assert tok.apply_chat_template(convo, add_generation_prompt=False) == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n")
    ids = tok.encode_chat(msgs)
    assert ids[:3] == [2, 105, 2364] and ids[-3:] == [105, 4368, 107]
    assert ids.count(2) == 1  # the template's <bos> is the only BOS
    with pytest.raises(EngineError, match="alternate"):
        tok.apply_chat_template([{"role": "assistant", "content": "x"}])


def test_cache_warm_load_reads_back_the_same_tokenizer(tok: GGUFTokenizer, cache_dir: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:

    files = sorted(p.name for p in cache_dir.iterdir())
    key = C.gguf_identity(resolve_model("gemma3-270m"))
    assert files == [f"{key}.{part}" for part in ("merges.npy", "meta.json", "tokenizer.json", "vocab.json")]
    T.clear_memo()
    calls = no_gguf_vocab(monkeypatch)  # the warm path reads the entry, never the GGUF's vocabulary
    warm = T.load_tokenizer("gemma3-270m")
    assert warm is not tok
    # first use from several threads at once, while the background build may still be running,
    # with parse_special flipping between calls (it is a switch on the shared Rust tokenizer)
    turn = "<start_of_turn>user\nhi<end_of_turn>"
    want = {True: tok.encode(turn, parse_special=True), False: tok.encode(turn)}
    assert want[True] != want[False]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda k: (k % 2 == 0, warm.encode(turn, parse_special=k % 2 == 0)), range(64)))
    assert all(ids == want[flag] for flag, ids in got)
    assert warm.encode(MIXED) == tok.encode(MIXED)
    assert (warm.bos_id, warm.eos_ids, warm.vocab_size) == (tok.bos_id, tok.eos_ids, tok.vocab_size)
    # the stored tokenizer.json is a valid standalone HF tokenizer
    from tokenizers import Tokenizer

    portable = Tokenizer.from_file(str(cache_dir / f"{key}.tokenizer.json"))
    assert portable.encode(MIXED, add_special_tokens=False).ids == tok.encode(MIXED, add_special=False)
    assert calls == []


# -- streaming detokenizer --------------------------------------------------------------------
def _streamed(tok, ids: list[int]) -> list[str]:  # type: ignore[no-untyped-def]
    s = tok.stream()
    return [s.push(i) for i in ids] + [s.flush()]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=60))
def test_stream_pieces_concatenate_to_decode(tok: GGUFTokenizer, text: str) -> None:
    ids = tok.encode(text, add_special=False)
    pieces = _streamed(tok, ids)
    for p in pieces:
        p.encode("utf-8")  # every piece is valid UTF-8 (no lone surrogates)
        assert "\ufffd" not in p or "\ufffd" in text
    assert "".join(pieces) == tok.decode(ids)
    if "\u2581" not in text:  # a literal U+2581 reads back as a space in SentencePiece
        assert "".join(pieces) == text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.one_of(st.integers(238, 493), st.integers(0, 262143)), max_size=40))
def test_stream_of_arbitrary_ids_never_breaks_utf8(tok: GGUFTokenizer, ids: list[int]) -> None:
    # byte-fallback tokens (238..493) in any order: split and invalid UTF-8 sequences
    pieces = _streamed(tok, ids)
    for p in pieces:
        p.encode("utf-8")
    assert "".join(pieces) == tok.decode(ids)
