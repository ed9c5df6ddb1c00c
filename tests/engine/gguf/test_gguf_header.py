"""The one GGUF header reader (engine.gguf.reader): the selective read agrees with the full one, and a
corrupt header (flipped bytes, cut short) is one GGUFError line naming the file, never another error."""

from __future__ import annotations

import random
from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.errors import GGUFError
from engine.gguf.reader import read_gguf, read_metadata
from engine.tokenizer.vocab import TOKENIZER_KEYS, read_vocab


def _kinds_gguf(path: Path) -> Path:
    """Every value kind the reader knows, a small vocabulary and three tensors (one quantized)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("x.str", "héllo")
    w.add_array("x.strs", ["a", "", "ünï"])
    w.add_array("x.ints", [1, -2, 3])
    w.add_array("x.floats", [0.5, 1.5])
    w.add_array("x.nested", [[1, 2], [3]])
    w.add_bool("x.bool", True)
    w.add_uint64("x.u64", 2**40)
    w.add_int8("x.i8", -5)
    w.add_string("tokenizer.ggml.model", "llama")
    w.add_array("tokenizer.ggml.tokens", ["<unk>", "<s>", "</s>", "a", "b"])
    w.add_array("tokenizer.ggml.scores", [0.0, 0.0, 0.0, -1.0, -2.0])
    w.add_array("tokenizer.ggml.token_type", [2, 3, 3, 1, 1])
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_float64("y.f64", 0.1)  # a key after the tokenizer's: the reader must step over, not stop
    w.add_tensor("a", np.arange(64, dtype=np.float32).reshape(2, 32))
    w.add_tensor("b", np.zeros((2, 34), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("s", np.array(1.5, dtype=np.float32))  # no dimensions: one element
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _same(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=False))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("prefixes", [TOKENIZER_KEYS, ("x.",), ("x.n", "y."), ("nothing",)])
def test_selective_read_is_the_full_read_filtered(tmp_path: Path, prefixes: tuple[str, ...]) -> None:
    p = _kinds_gguf(tmp_path / "kinds.gguf")
    full = read_gguf(p).metadata
    part = read_metadata(p, prefixes)
    want = {k: v for k, v in full.items() if k.startswith(prefixes)}
    assert list(part) == list(want) and all(_same(part[k], want[k]) for k in want)
    assert len(full) == 15 and _same(full["x.nested"], [np.array([1, 2], np.int32), np.array([3], np.int32)])


def test_tensor_views(tmp_path: Path) -> None:
    g = read_gguf(_kinds_gguf(tmp_path / "kinds.gguf"))
    assert [(t.shape, t.raw.shape) for t in g.tensors.values()] == [((2, 32), (2, 128)), ((2, 32), (2, 34)),
                                                                     ((), (1, 4))]
    assert np.frombuffer(g.tensors["s"].raw.tobytes(), np.float32)[0] == 1.5
    assert np.array_equal(g.tensors["a"].raw.view(np.float32), np.arange(64, dtype=np.float32).reshape(2, 32))


@pytest.mark.gemma
def test_gemma_tokenizer_keys_agree_with_the_full_read() -> None:
    from engine.gguf.aliases import resolve_model

    path = resolve_model("gemma3-270m")
    full = read_gguf(path)
    part = read_metadata(path, TOKENIZER_KEYS)
    assert len(part["tokenizer.ggml.tokens"]) == 262144 and len(full.tensors) > 100
    assert set(part) == {k for k in full.metadata if k.startswith(TOKENIZER_KEYS)}
    assert all(_same(part[k], full.metadata[k]) for k in part)


@pytest.mark.parametrize("edit,match", [
    (lambda d: d.replace(b"x.ints\x09\x00\x00\x00\x05\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00",
                         b"x.ints\x09\x00\x00\x00\x05\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x01"),
     r"truncated or corrupt GGUF metadata \(key 'x.ints': needs byte \d+, file has \d+\)"),
    (lambda d: d.replace(b"x.strs\x09\x00\x00\x00\x08\x00\x00\x00\x03", b"x.strs\x09\x00\x00\x00\x08\x00\x00\x00\xff"),
     r"metadata \(key 'x.strs': an array of \d+ strings runs past the end"),
    (lambda d: d.replace(b"x.bool\x07", b"x.bool\x0d"), r"metadata \(key 'x.bool': unknown metadata value type 13"),
    # the name length of tensor 's' (the last of three) made huge
    (lambda d: d.replace(b"\x01\x00\x00\x00\x00\x00\x00\x00s", b"\x01\x00\x00\x00\x00\x00\xff\xffs"),
     r"tensor index \(tensor 2 of 3: needs byte"),
])
def test_corrupt_header_names_section_and_key(tmp_path: Path, edit, match: str) -> None:  # type: ignore[no-untyped-def]
    p = _kinds_gguf(tmp_path / "k.gguf")
    data = p.read_bytes()
    changed = edit(data)
    assert changed != data
    p.write_bytes(changed)
    readers = [read_gguf] + ([lambda q: read_metadata(q, TOKENIZER_KEYS)] if "metadata" in match else [])
    for read in readers:  # the x. keys are stepped over by the tokenizer's read, and still checked
        with pytest.raises(GGUFError, match=match) as exc:
            read(p)
        assert str(exc.value).startswith(f"{p}: ") and "\n" not in str(exc.value)


def _readers(p: Path) -> list[object]:
    out: list[object] = []
    for read in (read_gguf, lambda q: read_metadata(q, TOKENIZER_KEYS), read_vocab):
        try:
            out.append(read(p))
        except GGUFError as exc:
            assert str(exc).startswith(f"{p}: ") and "\n" not in str(exc), exc
            out.append(exc)
    return out


@pytest.mark.slow
def test_byte_flip_fuzz_is_one_error_or_a_result(tmp_path: Path) -> None:
    # Every header byte flipped or overwritten (and some 8-byte fields made huge): GGUFError or a result.
    src = _kinds_gguf(tmp_path / "src.gguf").read_bytes()
    end = min(t.offset for t in read_gguf(tmp_path / "src.gguf").tensors.values())
    p = tmp_path / "fuzz.gguf"
    rng = random.Random(0)
    for i in range(end):
        for new in (src[i] ^ 0xFF, rng.randrange(256)):
            p.write_bytes(src[:i] + bytes([new]) + src[i + 1:])
            _readers(p)
    for i in range(end - 8):
        p.write_bytes(src[:i] + b"\xff" * 7 + b"\x7f" + src[i + 8:])
        _readers(p)


def test_cut_short_anywhere_in_the_header_is_one_error(tmp_path: Path) -> None:
    src = _kinds_gguf(tmp_path / "src.gguf").read_bytes()
    end = min(t.offset for t in read_gguf(tmp_path / "src.gguf").tensors.values())
    p = tmp_path / "cut.gguf"
    for n in range(end):
        p.write_bytes(src[:n])
        assert isinstance(_readers(p)[0], GGUFError), n
