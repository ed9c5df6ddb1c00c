"""`fak q4kdiag` end to end: JSON keys and numbers, --plan-only, bad input -> one line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import load_model
from engine.gguf.aliases import resolve_model
from support.ggufgen import tiny_hf_llama

pytestmark = pytest.mark.slow  # boots a model or a server per module: the full suite runs it

KEYS = {"model", "arch", "tensor_types", "file_bytes", "resident_bytes", "rss_bytes", "kernels", "membw_gbps",
        "prompt_ids", "top"}


def fak(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "commands.main", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "COLUMNS": "120"})


def _tensor_types(path: Path) -> dict[str, int]:
    """Tensors per type, as gguf-py's own reader counts them (independent of engine.gguf)."""
    from collections import Counter

    from gguf import GGUFReader

    return dict(Counter(t.tensor_type.name for t in GGUFReader(path).tensors))


# `max_abs_err` is the kernel (int16 activations) against float64 dequantize + matmul on N(0, 1) x,
# seeded. Measured on Gemma 3 270M Q4_K_M: Q8_0 5.2e-5, Q6_K 6.4e-5, Q5_0 7.1e-5, Q4_K 2.1e-4;
# the bounds are ~2.5x that.
MAX_ABS_ERR = {"Q8_0": 1.5e-4, "Q6_K": 1.5e-4, "Q5_0": 2e-4, "Q4_K": 5e-4}


@pytest.mark.gemma
def test_plan_only_json_reads_the_header() -> None:
    r = fak("q4kdiag", "--gguf", "gemma3-270m", "--plan-only", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert KEYS <= set(out)
    assert out["arch"] == "gemma3"
    assert out["tensor_types"] == _tensor_types(resolve_model("gemma3-270m"))
    assert out["file_bytes"] == os.path.getsize(resolve_model("gemma3-270m"))
    # resident = the bytes a resident load keeps (16-row tiles of the GGUF's bytes; Q4_K's scales
    # unpacked: 148 bytes per 256 values, not 144), read from the header alone, equal to what
    # load_model(resident=True) actually holds, far below the float32 plan
    assert out["resident_bytes"] == load_model(resolve_model("gemma3-270m"), resident=True).weights.nbytes
    assert 0.9 * out["file_bytes"] < out["resident_bytes"] < 1.05 * out["file_bytes"]
    assert out["f32_plan_bytes"] > 4 * out["file_bytes"] > 3.5 * out["resident_bytes"]
    assert out["kernels"] == [] and out["top"] == []


@pytest.mark.gemma
def test_full_json_has_kernels_and_top_k() -> None:
    r = fak("q4kdiag", "--gguf", "gemma3-270m", "--prompt", "The capital of France is", "--top", "3",
            "--membw", "13.6", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["membw_gbps"] == 13.6
    assert {k["type"] for k in out["kernels"]} == {"Q8_0", "Q5_0", "Q4_K", "Q6_K"}
    for k in out["kernels"]:
        assert 0 < k["max_abs_err"] <= MAX_ABS_ERR[k["type"]], k  # exactly 0: not the kernel being measured
        assert k["gbps"] > 0
    assert out["prompt_ids"][0] == 2  # BOS
    assert len(out["top"]) == 3
    logits = [t["logit"] for t in out["top"]]
    assert logits == sorted(logits, reverse=True)
    assert "Paris" in "".join(t["text"] for t in out["top"])
    assert out["rss_bytes"] > out["resident_bytes"] // 4


@pytest.mark.gemma
def test_rich_rendering_mentions_the_ceiling() -> None:
    r = fak("q4kdiag", "--plan-only", "--gguf", "gemma3-270m", "--membw", "10")
    assert r.returncode == 0, r.stderr
    assert "float32 plan" in r.stdout and "decode ceiling" in r.stdout and "Q4_K" in r.stdout


@pytest.mark.parametrize("args, needle", [
    (["--gguf", "/nonexistent/x.gguf"], "no such model file"),
    (["--plan-only", "--top", "0"], "--top must be >= 1"),
    (["--plan-only", "--membw", "-1"], "--membw must be > 0"),
    (["--plan-only", "--membw", "nan"], "--membw must be > 0 GB/s and finite, got nan"),
    (["--plan-only", "--membw", "inf"], "--membw must be > 0 GB/s and finite, got inf"),
])
def test_bad_input_is_one_line_exit_2(args: list[str], needle: str) -> None:
    r = fak("q4kdiag", *args)
    assert r.returncode == 2
    assert needle in r.stderr
    assert r.stderr.startswith("fak: error:") and len(r.stderr.strip().splitlines()) == 1


def test_not_a_gguf_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 64)
    r = fak("q4kdiag", "--gguf", str(bad), "--plan-only")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("fak: error:") and len(r.stderr.strip().splitlines()) == 1


def test_prompt_that_is_not_utf8_is_one_line() -> None:
    # argv bytes that are not UTF-8 (here 0xff) reach Python as a lone surrogate
    r = subprocess.run([sys.executable, "-m", "commands.main", "q4kdiag", "--gguf", "gemma3-270m", "--prompt",
                        os.fsdecode(b"\xff")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == "fak: error: q4kdiag: --prompt is not valid UTF-8 (at character 0)"


# --all-types: the kernel of every resident type, on the file's tensors or synthetic ones
# (N(0, 1) * 0.05 weights, 2048 columns, N(0, 1) x). Measured: the int16-dot types 1.1e-4 .. 1.8e-4,
# F16 4.7e-6, BF16 3.3e-6 (float32 sums only); the bounds are ~3x that.
ALL_TYPES_ERR = {"Q8_0": 5e-4, "Q5_0": 5e-4, "Q4_K": 5e-4, "Q6_K": 5e-4, "Q4_0": 5e-4, "Q4_1": 5e-4,
                 "Q5_1": 5e-4, "Q5_K": 5e-4, "F16": 2e-5, "BF16": 2e-5, "Q3_K": 5e-4, "IQ4_NL": 5e-4}


@pytest.mark.oracle  # the tiny model comes from transformers
def test_all_types_lists_every_resident_kernel(tmp_path: Path) -> None:
    from gguf import GGMLQuantizationType as QT

    from engine.model.resident import QUANT_TYPES
    from engine.quant.quantize import quantize_as
    from support.ggufgen import write_gguf

    path = write_gguf(tiny_hf_llama(), "llama", tmp_path / "tiny-q8.gguf",
                      quant=lambda n, a: (quantize_as(QT.Q8_0, a), QT.Q8_0))
    r = fak("q4kdiag", "--gguf", str(path), "--membw", "10", "--top", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert [k["type"] for k in json.loads(r.stdout)["kernels"]] == ["Q8_0"]  # the file's own types only
    r = fak("q4kdiag", "--gguf", str(path), "--membw", "10", "--top", "2", "--json", "--all-types")
    assert r.returncode == 0, r.stderr
    kernels = json.loads(r.stdout)["kernels"]
    assert [k["type"] for k in kernels] == list(QUANT_TYPES.values()) == list(ALL_TYPES_ERR)
    for k in kernels:
        assert 0 < k["max_abs_err"] <= ALL_TYPES_ERR[k["type"]], k
        assert k["gbps"] > 0
        assert k["tensor"].startswith("synthetic ") == (k["type"] != "Q8_0"), k
