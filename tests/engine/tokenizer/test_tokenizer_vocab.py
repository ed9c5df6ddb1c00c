"""llama.cpp's tokenizer test vectors: every *.gguf.inp/.out pair found, token for token."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from engine.errors import EngineError
from engine.tokenizer.build import PRE_SPLITS, build_tokenizer
from engine.tokenizer.tokenizer import GGUFTokenizer, load_gguf_tokenizer, load_tokenizer
from engine.tokenizer.vocab import VocabMeta, read_vocab
from support.vocab import MIXED, no_gguf_vocab, read_cases, vocab_dir, vocab_files

_loaded: dict[Path, GGUFTokenizer] = {}


def tokenizer_for(path: Path) -> GGUFTokenizer:
    if path not in _loaded:
        _loaded[path] = load_gguf_tokenizer(path, use_cache=False)
    return _loaded[path]


def test_vocab_dir_has_cases() -> None:
    assert vocab_files(), f"no *.gguf with .inp/.out pairs in {vocab_dir()} (set FAK_VOCAB_DIR)"


@pytest.mark.parametrize("gguf", vocab_files(), ids=lambda p: p.name)
def test_llama_cpp_vectors_match_exactly(gguf: Path) -> None:
    tok = tokenizer_for(gguf)
    cases = read_cases(gguf)
    assert cases
    bad = [(text, want, got) for text, want in cases
           if (got := tok.encode(text, add_special=False)) != want]
    assert not bad, f"{gguf.name}: {len(bad)}/{len(cases)} cases differ, first: {bad[0]!r}"


@pytest.mark.parametrize("gguf", vocab_files(), ids=lambda p: p.name)
def test_round_trip_on_vectors(gguf: Path) -> None:
    tok = tokenizer_for(gguf)
    for text, want in read_cases(gguf):
        assert tok.decode(want) == text, (gguf.name, text)
        stream = tok.stream()
        assert "".join(stream.push(i) for i in want) + stream.flush() == text


def test_metadata_reader_agrees_with_gguf_reader() -> None:
    from gguf import GGUFReader

    path = vocab_dir() / "ggml-vocab-llama-spm.gguf"
    meta = read_vocab(path)
    ref = GGUFReader(path)
    f = ref.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
    scores = ref.fields["tokenizer.ggml.scores"]
    types = ref.fields["tokenizer.ggml.token_type"]
    assert meta.tokens == tokens
    assert np.array_equal(meta.scores, np.array([scores.parts[i][0] for i in scores.data], dtype=np.float32))
    assert meta.types == [int(types.parts[i][0]) for i in types.data]
    assert (meta.model, meta.bos_id, meta.eos_id, meta.unk_id) == ("llama", 1, 2, 0)


def test_special_ids_and_add_bos() -> None:
    spm = tokenizer_for(vocab_dir() / "ggml-vocab-llama-spm.gguf")
    assert spm.bos_id == 1 and spm.encode("Hello")[0] == 1
    assert spm.encode("Hello", add_special=False)[0] != 1
    assert spm.encode("", add_special=True) == [1]
    llama3 = tokenizer_for(vocab_dir() / "ggml-vocab-llama-bpe.gguf")
    # llama.cpp adds BOS for the llama-bpe pre-tokenizer even though the file has no flag
    assert llama3.encode("Hi")[0] == 128000
    gpt2 = tokenizer_for(vocab_dir() / "ggml-vocab-gpt-2.gguf")
    assert gpt2.encode("Hi") == gpt2.encode("Hi", add_special=False)
    assert 50256 in gpt2.eos_ids


def test_special_tokens_only_with_parse_special() -> None:
    qwen = tokenizer_for(vocab_dir() / "ggml-vocab-qwen2.gguf")
    im_start = qwen.token_id("<|im_start|>")
    assert im_start is not None
    text = "<|im_start|>user\nhi"
    assert im_start not in qwen.encode(text)
    assert qwen.encode(text, parse_special=True)[0] == im_start
    assert qwen.decode(qwen.encode(text)) == text
    assert qwen.decode(qwen.encode(text, parse_special=True)) == text
    assert qwen.decode(qwen.encode(text, parse_special=True), skip_special=True) == "user\nhi"
    assert qwen.token_id("<|im_end|>") in qwen.eos_ids


def test_unknown_pre_tokenizer_is_an_error_naming_it() -> None:
    meta = VocabMeta(model="gpt2", pre="no-such-pre", arch="x", tokens=["a", "b", "ab"], types=[1, 1, 1],
                     merges=["a b"])
    with pytest.raises(EngineError, match="no-such-pre"):
        build_tokenizer(meta)


def test_every_pre_type_llama_cpp_maps_is_known() -> None:
    """The `tokenizer_pre == "..."` names of llama.cpp's llama-vocab.cpp (92 names):
    each either splits here or is refused with its own one-line reason."""
    from engine.tokenizer.build import UNSUPPORTED_PRE

    assert not UNSUPPORTED_PRE & set(PRE_SPLITS)
    for name in LLAMA_CPP_PRE:
        assert name in PRE_SPLITS or name in UNSUPPORTED_PRE, name


@pytest.mark.parametrize("pre", ["gemma4", "kimi-k2", "whitespace"])
def test_a_pre_type_split_by_other_means_is_refused_naming_it(pre: str) -> None:
    meta = VocabMeta(model="gpt2", pre=pre, arch="x", tokens=["a", "b", "ab"], types=[1, 1, 1], merges=["a b"])
    with pytest.raises(EngineError, match=f"pre-type '{pre}' .* is not supported"):
        build_tokenizer(meta)


# llama.cpp's llama-vocab.cpp (the build the bench compares against): every tokenizer.ggml.pre it maps
LLAMA_CPP_PRE = """a.x-4.0 afmoe bailingmoe bailingmoe2 bloom chameleon chatglm-bpe codeshell cohere2moe command-r dbrx
deepseek-coder deepseek-llm deepseek-r1-qwen deepseek-v3 default exaone exaone-moe exaone4 f2llmv2 falcon falcon-h1
falcon3 gemma4 gigachat glm4 glm5 gpt-2 gpt-4o gpt3-finnish granite-docling granite-embed-multi-311m
granite-embed-multi-97m grok-2 hunyuan hunyuan-dense hy_v4 jais jais-2 jina-de jina-es jina-v1-en jina-v2-code
jina-v2-de jina-v2-es jina-v5-nano joyai-llm kanana2 kimi-k2 kormo laguna lfm2 llada-moe llama-bpe llama-v3 llama3
llama4 megrez mellum mellum2 midm-2.0 minerva-7b minicpm5 minimax-m2 mmbert modern-bert mpt olmo phi-2 pixtral
poro-chat qwen2 qwen35 refact roberta-bpe sarvam-moe seed-coder smaug-bpe smollm solar-open spark2_5 stablelm2
starcoder superbpe talkie tekken tiny_aya trillion ufakzeka viking whitespace youtu""".split()


def test_unknown_tokenizer_model_is_an_error() -> None:
    meta = VocabMeta(model="wordpiece", pre="default", arch="x", tokens=["a"], types=[1])
    with pytest.raises(EngineError, match="wordpiece"):
        build_tokenizer(meta)


def test_issue_pre_types_are_known() -> None:
    for name in ("default", "gpt-2", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder", "falcon",
                 "starcoder", "refact", "mpt", "gpt-neox", "command-r"):
        assert name in PRE_SPLITS


def test_pre_types_split_as_documented() -> None:
    # one tiny byte-level vocab, different splits: digits alone (starcoder) vs in threes (llama3)
    letters = [chr(c) for c in range(ord("0"), ord("9") + 1)] + ["11", "111", "1111"]
    merges = ["1 1", "11 1", "11 11"]

    def encode(pre: str) -> list[str]:
        meta = VocabMeta(model="gpt2", pre=pre, arch="x", tokens=letters, types=[1] * len(letters),
                         merges=merges)
        tok = GGUFTokenizer.from_meta(meta)
        return [tok.token_text(i) for i in tok.encode("1111", add_special=False)]

    assert encode("gpt-2") == ["1111"]
    assert encode("llama-bpe") == ["111", "1"]
    assert encode("starcoder") == ["1", "1", "1", "1"]


def test_bad_files_give_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 64)
    with pytest.raises(EngineError, match="bad.gguf.*not a GGUF"):
        load_tokenizer(bad, use_cache=False)
    short = tmp_path / "short.gguf"
    short.write_bytes((vocab_dir() / "ggml-vocab-llama-spm.gguf").read_bytes()[:5000])
    with pytest.raises(EngineError, match="short.gguf.*truncated"):
        load_tokenizer(short, use_cache=False)
    big_endian = tmp_path / "be.gguf"
    big_endian.write_bytes(b"GGUF" + (3).to_bytes(4, "big") + b"\0" * 64)
    with pytest.raises(EngineError, match="be.gguf.*version 50331648 is not supported"):
        load_tokenizer(big_endian, use_cache=False)
    with pytest.raises(EngineError, match="no such model"):
        load_tokenizer(tmp_path / "missing.gguf")


def _tiny_vocab_gguf(path: Path, **bad: object) -> Path:
    """A 4-token SPM vocabulary; `bad` overrides keys ("bos" -> tokenizer.ggml.bos_token_id) with values
    of the wrong GGUF type."""
    import gguf

    from support.ggufgen import add_kv

    w = gguf.GGUFWriter(str(path), "llama")
    kv: dict[str, object] = {"model": "llama", "tokens": ["<unk>", "<s>", "</s>", "a"], "token_type": [2, 3, 3, 1],
                             "scores": [0.0, 0.0, 0.0, -1.0], "bos_token_id": 1, **bad}
    for key, val in kv.items():
        add_kv(w, key if key.startswith("tokenizer.") else f"tokenizer.ggml.{key}", val)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


@pytest.mark.parametrize("key,value", [("bos_token_id", "one"), ("token_type", ["x", "y", "z", "w"]),
                                       ("scores", ["a", "b", "c", "d"]), ("tokens", [1, 2, 3]), ("merges", [1, 2])])
def test_wrong_metadata_types_name_the_key(tmp_path: Path, key: str, value: object) -> None:
    assert load_tokenizer(_tiny_vocab_gguf(tmp_path / "ok.gguf"), use_cache=False).encode("a", add_special=False)
    p = _tiny_vocab_gguf(tmp_path / "bad.gguf", **{key: value})
    with pytest.raises(EngineError, match=f"bad.gguf: metadata key 'tokenizer.ggml.{key}' must be"):
        load_tokenizer(p, use_cache=False)


DIGIT_SPLITS = {  # how "12345" is cut before BPE, per llama.cpp's regexes for each pre-tokenizer
    "gpt-2": ["12345"], "mpt": ["12345"], "gpt-neox": ["12345"], "deepseek-llm": ["12345"],
    "llama-bpe": ["123", "45"], "falcon": ["123", "45"], "default": ["123", "45"], "chatglm-bpe": ["123", "45"],
    "qwen2": list("12345"), "deepseek-coder": list("12345"), "starcoder": list("12345"),
    "refact": list("12345"), "command-r": list("12345"),
    # llama.cpp's newer pre-types (its llama-vocab.cpp regexes)
    "qwen35": list("12345"), "grok-2": list("12345"), "solar-open": list("12345"), "seed-coder": list("12345"),
    "ufakzeka": list("12345"), "exaone-moe": list("12345"), "bailingmoe": list("12345"), "youtu": list("12345"),
    "mellum2": list("12345"), "laguna": list("12345"), "chameleon": list("12345"), "spark2_5": list("12345"),
    "jais-2": ["123", "45"], "jina-v5-nano": ["123", "45"], "hy_v4": ["123", "45"], "glm5": ["123", "45"],
    "minicpm5": ["123", "45"], "kanana2": ["123", "45"], "granite-embed-multi-97m": ["123", "45"],
    "superbpe": ["12", "345"], "tiny_aya": ["12", "345"], "cohere2moe": ["12", "345"],
}


@pytest.mark.parametrize("pre", sorted(PRE_SPLITS))
def test_every_pre_tokenizer_compiles_and_is_lossless(pre: str) -> None:
    from engine.tokenizer.tokenizer import GGUFTokenizer

    alphabet = [chr(c) for c in range(33, 127)] + ["Ġ", "Ċ", "ĉ"] + [chr(c) for c in range(0xA1, 0x100) if c != 0xAD]
    meta = VocabMeta(model="gpt2", pre=pre, arch="x", tokens=alphabet + ["12"], types=[1] * (len(alphabet) + 1),
                     merges=["1 2"])
    tok = GGUFTokenizer.from_meta(meta)
    text = "Hello, y'all! 12345  3.14\n\n\tdon'T   stop ¿qué? 日本"
    ascii_text = "".join(c for c in text if ord(c) < 128)  # the tiny vocab has no multi-byte letters
    pieces = [p for p, _ in tok.hf.pre_tokenizer.pre_tokenize_str(ascii_text)]
    assert tok.decode(tok.encode(ascii_text, add_special=False)) == ascii_text
    assert "".join(pieces).replace("Ġ", " ").replace("Ċ", "\n").replace("ĉ", "\t") == ascii_text
    if pre in DIGIT_SPLITS:
        assert [p for p, _ in tok.hf.pre_tokenizer.pre_tokenize_str("12345")] == DIGIT_SPLITS[pre]


def test_spm_merges_order() -> None:
    from engine.tokenizer.build import spm_merges

    tokens = ["a", "b", "c", "ab", "bc", "abc", "ca"]
    vocab = {t: i for i, t in enumerate(tokens)}
    rank = [0.0, 0.0, 0.0, -1.0, -0.5, -0.5, -3.0]  # higher is better: bc, abc (tie), ab, ca
    got = [(tokens[a], tokens[b]) for a, b in spm_merges(tokens, vocab, rank).tolist()]
    # ties on rank: longer left piece first, then longer right piece ("a"+"bc" before "b"+"c")
    assert got == [("ab", "c"), ("a", "bc"), ("b", "c"), ("a", "b"), ("c", "a")]


@pytest.mark.oracle
@pytest.mark.parametrize("name", ["ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-spm.gguf"])
@pytest.mark.slow
def test_matches_hf_transformers_beyond_the_vectors(name: str) -> None:
    # the two vocabularies transformers loads quickly (qwen2 and llama-bpe agree too but take ~30 s each)
    from support.hf_gguf import tokenizer

    hf = tokenizer(vocab_dir() / name)
    tok = tokenizer_for(vocab_dir() / name)
    ids = tok.encode(MIXED, add_special=False)
    assert ids == hf.encode(MIXED, add_special_tokens=False)
    assert tok.decode(ids) == hf.decode(ids) == MIXED


@pytest.mark.parametrize("template,needle", [("{{ x | nofilter }}", "does not compile"),
                                             ("{{ ().__class__.__mro__ }}", "unsafe")])
def test_bad_chat_template_names_the_file(tmp_path: Path, template: str, needle: str) -> None:
    tok = load_tokenizer(_tiny_vocab_gguf(tmp_path / "tpl.gguf", **{"tokenizer.chat_template": template}), use_cache=False)
    with pytest.raises(EngineError, match=f"tpl.gguf: chat template.*{needle}"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_huge_string_length_is_one_error(tmp_path: Path) -> None:
    p = _tiny_vocab_gguf(tmp_path / "huge.gguf")
    data = p.read_bytes()
    field = (5).to_bytes(8, "little") + b"llama"  # general.architecture's value: length, then bytes
    assert field in data
    p.write_bytes(data.replace(field, (2**63 - 1).to_bytes(8, "little") + b"llama", 1))
    with pytest.raises(EngineError, match="huge.gguf: truncated or corrupt GGUF metadata"):
        load_tokenizer(p, use_cache=False)


# -- the on-disk tokenizer cache (engine/tokenizer/cache.py) -------------------------------------
def _cached_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> Path:
    monkeypatch.setenv("FAK_TOKENIZER_CACHE", str(tmp_path / "cache"))
    src = tmp_path / name
    src.write_bytes((vocab_dir() / name).read_bytes())
    return src


@pytest.mark.parametrize("name", ["ggml-vocab-llama-spm.gguf", "ggml-vocab-qwen2.gguf"])
@pytest.mark.slow
def test_cache_warm_load_reads_the_entry_not_the_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      name: str) -> None:
    import engine.tokenizer.tokenizer as T

    src = _cached_copy(tmp_path, monkeypatch, name)
    cold = T.load_gguf_tokenizer(src)
    text = "Hello world, <|im_start|> 1234 naïve"
    want = (cold.encode(text), cold.decode(cold.encode(text)), cold.bos_id, cold.eos_ids, cold.vocab_size)
    T.clear_memo()
    calls = no_gguf_vocab(monkeypatch)
    warm = T.load_gguf_tokenizer(src)
    assert warm is not cold
    assert (warm.encode(text), warm.decode(warm.encode(text)), warm.bos_id, warm.eos_ids, warm.vocab_size) == want
    assert calls == []


@pytest.mark.parametrize("part", ["meta.json", "vocab.json", "merges.npy"])
def test_cache_damaged_entry_is_rebuilt_rewritten_and_then_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 part: str) -> None:
    import engine.tokenizer.cache as C
    import engine.tokenizer.tokenizer as T

    src = _cached_copy(tmp_path, monkeypatch, "ggml-vocab-llama-spm.gguf")
    key = C.gguf_identity(src)
    first = T.load_gguf_tokenizer(src).encode("Hello world")
    entry = C.entry_paths(key)
    entry[part].write_text("{not json")
    T.clear_memo()
    assert T.load_gguf_tokenizer(src).encode("Hello world") == first  # rebuilt from the GGUF
    doc = C.load_meta(key)  # ... and rewritten: the entry parses again
    assert doc is not None
    tokens, _, plan = C.load_vocab_and_plan(key, doc)
    assert len(tokens) == 32000 and plan.kind == "llama"
    T.clear_memo()
    calls = no_gguf_vocab(monkeypatch)
    assert T.load_gguf_tokenizer(src).encode("Hello world") == first  # and the next load reads it
    assert calls == []


def test_cache_key_follows_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.tokenizer.cache as C

    src = _cached_copy(tmp_path, monkeypatch, "ggml-vocab-llama-spm.gguf")
    orig = src.stat()
    key1 = C.gguf_identity(src)
    os.utime(src, ns=(1_000_000_000, 1_000_000_000))
    assert C.gguf_identity(src) != key1  # mtime is part of the identity
    os.utime(src, ns=(orig.st_atime_ns, orig.st_mtime_ns))
    assert C.gguf_identity(src) == key1
    with open(src, "r+b") as f:  # same size and mtime, other bytes in the header
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    os.utime(src, ns=(orig.st_atime_ns, orig.st_mtime_ns))
    assert C.gguf_identity(src) != key1
