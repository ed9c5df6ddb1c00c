"""Every resident block type vs the plain float32 path (issue 19 "Must show"): per type on a synthetic
checkpoint quantized in memory, and the usual file mixes (Q4_0, Q4_K_M, Q5_K_M, Q8_0, F16, BF16) as tiny
GGUF files loaded both ways. Same argmax everywhere, |dlogit| <= 0.05, 16 greedy tokens equal, and a
lane's logits the same alone or in a batch."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

from engine import BatchSession, load_model
from engine.model.forward import Model, Weights
from engine.model.resident import QuantWeight, resident_nbytes, resident_weight
from engine.model.synthetic import SYNTHETIC_CONFIG, synthetic_weights
from engine.quant.quantize import quantize_as, quantize_q8_0
from support.agree import agree, serial_steps
from support.blocks import random_raw_blocks
from support.ggufgen import tiny_hf_llama

NEW_TYPES = [QT.Q4_0, QT.Q4_1, QT.Q5_1, QT.Q5_K, QT.F16, QT.BF16, QT.Q3_K, QT.IQ4_NL]
STORED = {QT.Q3_K: "Q6_K", QT.IQ4_NL: "Q8_0"}  # widened to blocks of the same values (engine/quant/widen.py)
TOL = 0.05  # the bound on |logit diff|, resident vs plain
# K-quants need rows of a multiple of 256 values: the synthetic checkpoint, widened
CONFIG = dataclasses.replace(SYNTHETIC_CONFIG, hidden=256, ffn=512, head_dim=64, embed_scale=16.0)


def _pair(qtype: QT, seed: int = 0) -> tuple[Model, Model]:
    """The widened synthetic checkpoint with every matrix in qtype: resident vs its plain twin."""
    W = synthetic_weights(CONFIG, seed)
    res: dict[int, object] = {}
    plain: dict[int, object] = {}

    def conv(name: str, w: object) -> None:
        if id(w) in res or not isinstance(w, np.ndarray) or w.ndim != 2:
            return
        raw = quantize_as(qtype, w)
        res[id(w)] = resident_weight(name, qtype, raw, w.shape)
        plain[id(w)] = dequantize(raw, qtype).astype(np.float32).reshape(w.shape)

    conv("token_embd.weight", W.token_embd)
    for i, lw in enumerate(W.layers):
        for f in dataclasses.fields(lw):
            conv(f"blk.{i}.{f.name}", getattr(lw, f.name))

    def rebuild(table: dict[int, object]) -> Model:
        sub = lambda w: table.get(id(w), w)  # noqa: E731
        layers = [dataclasses.replace(lw, **{f.name: sub(getattr(lw, f.name)) for f in dataclasses.fields(lw)})
                  for lw in W.layers]
        return Model(CONFIG, Weights(sub(W.token_embd), layers, W.output_norm, sub(W.output)), name=qtype.name)

    return rebuild(res), rebuild(plain)


@pytest.fixture(scope="module", params=NEW_TYPES, ids=lambda t: t.name)
def pair(request: pytest.FixtureRequest) -> tuple[QT, Model, Model]:
    return (request.param, *_pair(request.param))


def test_resident_type_matches_plain(pair: tuple[QT, Model, Model]) -> None:
    qtype, res, plain = pair
    w = res.weights.layers[0].w_down
    assert isinstance(w, QuantWeight) and w.layout == STORED.get(qtype, qtype.name) + "x16"
    assert w.type_name == qtype.name
    assert np.array_equal(w.dequantize(), plain.weights.layers[0].w_down)  # the tiles hold the file's values
    assert w.nbytes == resident_nbytes(qtype.name, *w.shape)  # what q4kdiag's header-only plan counts
    if qtype in (QT.F16, QT.BF16):  # 16-bit floats stay 16-bit (a float32 copy was twice the bytes)
        assert w.nbytes == 2 * w.shape[0] * w.shape[1]
    for ids in ([1, 2, 3, 4, 5], [200, 17, 99, 3, 42, 8, 250, 1, 0, 64]):
        prompt, decode = agree(res, plain, ids, prompt_tol=TOL, decode_tol=TOL)
        print(f"{qtype.name}: max |logit diff| {prompt:.2e} prompt, {decode:.2e} decode")


def test_resident_type_lane_is_the_same_alone_or_batched(pair: tuple[QT, Model, Model]) -> None:
    _, res, _ = pair
    rng = np.random.default_rng(7)
    prompts = [[1, 2, 3], [9, 8], [100, 101, 102, 103]] + [list(rng.integers(0, 255, 2)) for _ in range(10)]
    serial, sessions = serial_steps(res, prompts)  # 13 lanes: groups of 8, 4 and 1
    batched = BatchSession(sessions).step_batch([p[-1] + 1 for p in prompts])
    for b, row in enumerate(serial):
        assert np.array_equal(batched[b], row)


@pytest.mark.slow
def test_new_types_stay_tiled_under_fak_tiles_0(monkeypatch: pytest.MonkeyPatch) -> None:
    """FAK_TILES=0 (the A/B switch to GGUF-block kernels) has no block kernel for the six: they stay tiles;
    the widened two run as the GGUF blocks of their wider type."""
    from engine.model.resident import warmup

    monkeypatch.setenv("FAK_TILES", "0")
    warmup()  # warms the block kernels, and the tile kernels these need
    x = np.random.default_rng(2).standard_normal((3, 256)).astype(np.float32)
    for qtype in NEW_TYPES:
        raw = quantize_as(qtype, np.random.default_rng(1).standard_normal((20, 256)).astype(np.float32))
        w = resident_weight("t", qtype, raw, (20, 256))
        assert isinstance(w, QuantWeight) and w.layout == STORED.get(qtype, qtype.name + "x16")
        ref = x.astype(np.float64) @ dequantize(raw, qtype).astype(np.float64).reshape(20, 256).T
        assert np.abs(w.matmul(x) - ref).max() <= 1e-3 * np.abs(ref).max()


# ---- the usual file mixes, as GGUF files ---------------------------------------------------------

# llama.cpp's mixes, in miniature: *_K_M keeps attn_v, ffn_down and the output in Q6_K
MIXES: dict[str, Callable[[str], QT]] = {
    "Q4_0": lambda name: QT.Q6_K if name == "output.weight" else QT.Q4_0,
    "Q4_K_M": lambda name: QT.Q6_K if name.endswith(("attn_v.weight", "ffn_down.weight", "output.weight")) else QT.Q4_K,
    "Q5_K_M": lambda name: QT.Q6_K if name.endswith(("attn_v.weight", "ffn_down.weight", "output.weight")) else QT.Q5_K,
    "Q3_K_M": lambda name: QT.Q5_K if name.endswith(("attn_v.weight", "ffn_down.weight")) else (
        QT.Q6_K if name == "output.weight" else QT.Q3_K),
    "IQ4_NL": lambda name: QT.Q6_K if name == "output.weight" else QT.IQ4_NL,
    "Q8_0": lambda name: QT.Q8_0,
    "F16": lambda name: QT.F16,
    "BF16": lambda name: QT.BF16,
}


@pytest.fixture(scope="module")
def mix_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from support.ggufgen import write_gguf

    model = tiny_hf_llama()
    out = {}
    for mix, type_of in MIXES.items():
        path = tmp_path_factory.mktemp("mix") / f"tiny-{mix}.gguf"
        out[mix] = write_gguf(model, "llama", path, quant=lambda n, a, t=type_of: (quantize_as(t(n), a), t(n)))
    return out


@pytest.mark.oracle  # the tiny model comes from transformers
@pytest.mark.parametrize("mix", list(MIXES))
def test_usual_file_mixes_run_resident(mix_files: dict[str, Path], mix: str) -> None:
    res = load_model(mix_files[mix], resident=True, progress=False)
    plain = load_model(mix_files[mix], progress=False)
    want = {MIXES[mix](n).name for n in ("blk.0.attn_q.weight", "blk.0.ffn_down.weight", "output.weight")}
    assert set(res.tensor_types) == want | {"F32"}  # the norms stay F32
    for w in (res.weights.layers[1].wq, res.weights.layers[1].w_down, res.weights.output):
        assert isinstance(w, QuantWeight) and w.layout.endswith("x16")
    prompt, decode = agree(res, plain, [1, 5, 77, 300, 12, 9], prompt_tol=TOL, decode_tol=TOL)
    print(f"{mix}: max |logit diff| {prompt:.2e} prompt, {decode:.2e} decode")


@pytest.mark.oracle
@pytest.mark.slow
def test_unsupported_resident_type_is_one_line_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Q2_K matrix (no resident kernel): `fak run` names the tensor and the type and points to --plain,
    exit 2, one line; --plain then reads it (the float32 path knows every gguf-py type)."""
    import os
    import subprocess
    import sys

    from support.ggufgen import write_gguf

    rng = np.random.default_rng(3)

    def q2_k(name: str, a: np.ndarray) -> tuple[np.ndarray, QT]:
        if name != "blk.1.ffn_up.weight":
            return quantize_q8_0(a), QT.Q8_0
        raw = rng.integers(0, 256, (a.shape[0], a.shape[1] // 256, 84), dtype=np.uint8)
        raw[:, :, 80:84] = np.full(raw.shape[:2] + (2,), 1e-3, np.float16).view(np.uint8).reshape(*raw.shape[:2], 4)
        return raw.reshape(a.shape[0], -1), QT.Q2_K

    path = write_gguf(tiny_hf_llama(), "llama", tmp_path / "q2k.gguf", quant=q2_k)
    # in process: the loader checks every matrix's type before it makes any tensor resident
    from engine.errors import GGUFError
    from engine.model import loader

    made: list[str] = []
    real = loader.resident_weight
    monkeypatch.setattr(loader, "resident_weight", lambda name, *a: made.append(name) or real(name, *a))
    with pytest.raises(GGUFError, match=r"q2k.gguf: tensor 'blk.1.ffn_up.weight' is Q2_K, which has no resident"):
        load_model(path, resident=True, progress=False)
    assert made == []
    monkeypatch.undo()
    env = {**os.environ, "COLUMNS": "200"}
    run = lambda *a: subprocess.run([sys.executable, "-m", "commands.main", "run", str(path), "--ids", "1,2,3",  # noqa: E731
                                     "--max-tokens", "2", "--json", *a], capture_output=True, text=True,
                                    timeout=300, env=env)
    r = run()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("fak: error:"), line
    assert "'blk.1.ffn_up.weight'" in line and "Q2_K" in line and "--plain" in line
    r = run("--plain")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["generated_ids"]) == 2


@pytest.mark.parametrize("qtype", list(STORED), ids=lambda t: t.name)
def test_widened_blocks_hold_the_same_values(qtype: QT) -> None:
    """Random bytes (every bit pattern: Q3_K's q = -4 too): the wider blocks dequantize, by gguf-py, to the
    source's values bit for bit, and so do the resident tiles."""
    from engine.quant.widen import WIDEN

    bs, _ = GGML_QUANT_SIZES[qtype]
    raw = random_raw_blocks(qtype, 40 * 512 // bs, seed=5).reshape(40, -1)
    wide, repack = WIDEN[qtype]
    assert wide.name == STORED[qtype]
    ref = dequantize(raw, qtype)
    assert np.array_equal(dequantize(repack(raw), wide), ref)
    w = resident_weight("t", qtype, raw, (40, 512))
    assert isinstance(w, QuantWeight) and np.array_equal(w.dequantize(), ref)
