"""Corrupt or unsupported GGUF files -> one GGUFError naming the file and the problem; CLI exit 2, one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from engine import load_model
from engine.errors import GGUFError
from support.ggufgen import tiny_llama_gguf


def test_valid_file_loads(tmp_path: Path) -> None:
    m = load_model(str(tiny_llama_gguf(tmp_path / "ok.gguf")))
    assert m.config.arch == "llama" and m.config.vocab_size == 64


def _case(tmp_path: Path, case: str) -> Path:
    p = tmp_path / f"{case}.gguf"
    if case == "truncated":
        tiny_llama_gguf(p)
        p.write_bytes(p.read_bytes()[:-500])
    elif case == "truncated_header":
        tiny_llama_gguf(p)
        p.write_bytes(p.read_bytes()[:40])
    elif case == "bad_magic":
        tiny_llama_gguf(p)
        p.write_bytes(b"GGML" + p.read_bytes()[4:])
    elif case == "empty":
        p.write_bytes(b"")
    elif case == "missing_tensor":
        tiny_llama_gguf(p, tensors={"blk.0.ffn_up.weight": None})  # type: ignore[dict-item]
    elif case == "wrong_shape":
        tiny_llama_gguf(p, tensors={"blk.0.attn_q.weight": np.zeros((16, 32), np.float32)})
    elif case == "unsupported_arch":
        tiny_llama_gguf(p, arch="mamba")
    elif case == "empty_dim":
        tiny_llama_gguf(p)
        info = b"blk.0.attn_q.weight" + (2).to_bytes(4, "little") + (32).to_bytes(8, "little")
        p.write_bytes(p.read_bytes().replace(info, info[:-8] + (0).to_bytes(8, "little")))
    elif case in BAD_METADATA:
        tiny_llama_gguf(p, kv=dict([BAD_METADATA[case][:2]]))
    elif case == "unsupported_type":
        raw = np.zeros((32, 320), dtype=np.uint8)  # 32 rows of eight 32-value Q8_1 blocks -> (32, 256)
        q8_1 = gguf.GGMLQuantizationType.Q8_1  # a type no dequantizer reads (gguf-py's neither)
        tiny_llama_gguf(p, tensors={"blk.0.ffn_down.weight": raw}, raw_types={"blk.0.ffn_down.weight": q8_1})
    return p


# case -> (metadata key, bad value, expected message): wrong types and impossible sizes are one line too
BAD_METADATA = {
    "alignment_zero": ("general.alignment", 0, "'general.alignment' must be a positive integer"),
    "string_size": ("llama.context_length", "abc", "'llama.context_length' must be an integer, got 'abc'"),
    "array_size": ("llama.vocab_size", [1, 2], "'llama.vocab_size' must be an integer"),
    "zero_heads": ("llama.attention.head_count", 0, "'llama.attention.head_count' must be positive"),
    "string_bos": ("tokenizer.ggml.bos_token_id", "x", "'tokenizer.ggml.bos_token_id' must be an integer"),
    "kv_heads": ("llama.attention.head_count_kv", 3, "2 attention heads are not a multiple of 3 KV heads"),
    "huge_block_count": ("llama.block_count", 1862270977, "missing tensor 'blk.1862270976.attn_norm.weight'"),
}

CASES = {
    "truncated": "truncated",
    "truncated_header": "truncated",
    "bad_magic": "not a GGUF file",
    "empty": "cannot map file|not a GGUF",
    "missing_tensor": "missing tensor 'blk.0.ffn_up.weight'",
    "wrong_shape": "tensor 'blk.0.attn_q.weight' has shape \\(16, 32\\), expected \\(32, 32\\)",
    "unsupported_arch": "unsupported architecture 'mamba'",
    "unsupported_type": "tensor 'blk.0.ffn_down.weight' has unsupported type Q8_1",
    "empty_dim": "tensor 'blk.0.attn_q.weight' has an empty dimension",
    **{case: msg for case, (_, _, msg) in BAD_METADATA.items()},
}


@pytest.mark.parametrize("case", list(CASES))
def test_corrupt_raises_gguf_error(tmp_path: Path, case: str) -> None:
    p = _case(tmp_path, case)
    with pytest.raises(GGUFError, match=CASES[case]) as exc:
        load_model(str(p))
    assert str(p) in str(exc.value)


@pytest.mark.parametrize("case", ["truncated", "bad_magic", "wrong_shape", "unsupported_arch", "unsupported_type",
                                  "string_size", "alignment_zero"])
def test_cli_one_line_exit_2(tmp_path: Path, case: str) -> None:
    p = _case(tmp_path, case)
    r = subprocess.run([sys.executable, "-m", "commands.main", "run", str(p), "--ids", "1,2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fak: error: ") and str(p) in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_rope_freqs_tensor_is_loaded(tmp_path: Path) -> None:
    from engine import Session

    plain = load_model(str(tiny_llama_gguf(tmp_path / "a.gguf")))
    ones = load_model(str(tiny_llama_gguf(tmp_path / "b.gguf", tensors={"rope_freqs.weight": np.ones(8, np.float32)})))
    fac = load_model(str(tiny_llama_gguf(tmp_path / "c.gguf", tensors={"rope_freqs.weight": np.full(8, 4.0, np.float32)})))
    assert plain.weights.rope_freqs is None and ones.weights.rope_freqs.shape == (8,)
    ids = [1, 2, 3, 4, 5, 6]
    assert np.array_equal(Session(plain).prefill(ids), Session(ones).prefill(ids))
    assert not np.allclose(Session(plain).prefill(ids), Session(fac).prefill(ids))
    with pytest.raises(GGUFError, match="rope_freqs.weight' has shape \\(5,\\)"):
        load_model(str(tiny_llama_gguf(tmp_path / "d.gguf", tensors={"rope_freqs.weight": np.ones(5, np.float32)})))


def test_header_parser_agrees_with_gguf_reader(tmp_path: Path) -> None:
    # Our parser (fast on 262k-token vocabularies) against gguf.GGUFReader on every value kind.
    from engine.gguf.reader import read_gguf

    p = tmp_path / "kinds.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_string("x.str", "héllo")
    w.add_array("x.strs", ["a", "", "ünï"])
    w.add_array("x.ints", [1, -2, 3])
    w.add_array("x.floats", [0.5, 1.5])
    w.add_bool("x.bool", True)
    w.add_uint64("x.u64", 2**40)
    w.add_float64("x.f64", 0.1)
    w.add_int8("x.i8", -5)
    w.add_tensor("a", np.arange(64, dtype=np.float32).reshape(2, 32))
    w.add_tensor("b", np.arange(32, dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours = read_gguf(p)
    ref = gguf.GGUFReader(str(p))
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        want = field.contents()
        got = ours.metadata[key]
        got = got.tolist() if isinstance(got, np.ndarray) else got
        assert got == pytest.approx(want) if isinstance(want, float) else got == want, key
    assert list(ours.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        mine = ours.tensors[t.name]
        assert mine.qtype == t.tensor_type and mine.offset == t.data_offset and mine.nbytes == t.n_bytes
        assert np.array_equal(np.asarray(mine.raw).reshape(-1), np.asarray(t.data).view(np.uint8).reshape(-1))
