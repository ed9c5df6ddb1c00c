"""The one-kernel single-lane decode step (engine/kernels/lane_kernel.py, engine/model/lane_step.py).

It must give the same bits as the generic forward for every architecture it covers (it calls the same
compiled tile dots, glue twins and attention halves), whatever size the thread team is, and it must
decline what it does not cover instead of computing it differently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import engine.model.lane_step as LS
from engine import Session, load_model
from engine.model.forward import Model
from engine.model.synthetic import synthetic_model
from engine.quant.quantize import quantize_as

# the second prompt runs far past the tiny models' windows (8)
PROMPTS = [[1, 5, 9, 200, 17], list(range(20, 320, 7))]
# llama-family and gemma variants the kernel covers: biases (qwen2), q/k norms and post-norms (gemma3),
# softcaps and alternating windows (gemma2), granite's multipliers, a NoPE layer (smollm3), a window (mistral)
ARCHS = ["llama", "qwen2", "qwen3", "gemma3", "gemma2", "granite", "smollm3", "mistral"]


def _mixed(name: str, a: np.ndarray) -> tuple[np.ndarray, QT]:
    """Several tile kinds in one model: Q8_0 attention, Q5_0 / Q4_0 FFN, F16 down projections."""
    if "ffn_down" in name:
        return np.ascontiguousarray(a.astype(np.float16)).view(np.uint8), QT.F16
    qt = QT.Q5_0 if "ffn_gate" in name else QT.Q4_0 if "ffn_up" in name else QT.Q8_0
    return quantize_as(qt, a), qt


def _decode(model: Model, prompt: list[int], steps: int, lane: bool) -> np.ndarray:
    """Logits of the prompt's last position and of `steps` greedy steps, with the lane kernel on or off."""
    model._lane_plan_built = True
    model._lane_plan = LS.LanePlan.of(model) if lane else None
    s = Session(model)
    out = [s.prefill(prompt)]
    for _ in range(steps):
        out.append(s.step(int(np.argmax(out[-1]))))
    s.free()
    model._lane_plan_built = False
    return np.stack(out)


class _Count:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = LS.lane_layers

        def counted(*a: Any) -> None:
            self.calls += 1
            real(*a)

        monkeypatch.setattr(LS, "lane_layers", counted)


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Model]:
    from support.ggufgen import random_hf_model, write_gguf

    arch = request.param
    path = write_gguf(random_hf_model(arch, seed=3), arch, tmp_path_factory.mktemp(arch) / "q.gguf", quant=_mixed)
    return arch, load_model(str(path), resident=True, progress=False)


@pytest.mark.oracle
def test_lane_kernel_is_the_generic_forward_bit_for_bit(tiny: tuple[str, Model], monkeypatch: pytest.MonkeyPatch) -> None:
    arch, model = tiny
    plan = LS.LanePlan.of(model)
    assert plan is not None and plan.head >= 0, f"{arch}: the lane kernel should cover this model and its head"
    kinds = {int(k) for k in plan.prods[:, 0]}
    assert len(kinds) >= 3  # int tiles of several kinds and float (F16) tiles
    for prompt in PROMPTS:
        count = _Count(monkeypatch)
        on = _decode(model, prompt, 24, lane=True)
        assert count.calls == 24  # every decode step went through the kernel (the prefill did not)
        off = _decode(model, prompt, 24, lane=False)
        assert count.calls == 24
        assert np.array_equal(on, off), f"{arch}: max |diff| {np.abs(on - off).max():.3e}"


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ["gemma3", "qwen2"])
def test_team_size_does_not_change_the_bits(arch: str, tmp_path: Path) -> None:
    """Tasks are claimed, not assigned: a team of one, or one asked for more threads than it has,
    computes the same row (a thread that never arrives cannot stall the others)."""
    from support.ggufgen import random_hf_model, write_gguf

    model = load_model(str(write_gguf(random_hf_model(arch, seed=3), arch, tmp_path / "q.gguf", quant=_mixed)),
                       resident=True, progress=False)
    ref = _decode(model, PROMPTS[1], 12, lane=True)
    plan = LS.LanePlan.of(model)
    assert plan is not None
    for threads in (1, 3, 8):
        model._lane_plan_built, model._lane_plan = True, plan
        plan.threads = threads
        s = Session(model)
        got = [s.prefill(PROMPTS[1])]
        for _ in range(12):
            got.append(s.step(int(np.argmax(got[-1]))))
        s.free()
        assert np.array_equal(np.stack(got), ref), f"team of {threads}"
    model._lane_plan_built = False


@pytest.mark.gemma
def test_both_threads_claim_product_work() -> None:
    """The bit-equality above would hold trivially on one thread: on Gemma 3 270M's step both threads of
    the team claim chunks of the products (counted per thread in the phases' spare counter slots)."""
    from engine.kernels.tasks import LINE
    from support.numba_threads import team_size

    assert team_size() >= 2
    model = load_model("gemma3-270m", resident=True, progress=False)
    s = Session(model)
    s.prefill([2, 651, 6037, 529])
    s.step(9405)
    s.free()
    ctr = model.lane_plan().last_counters  # type: ignore[union-attr]
    per_thread = ctr.reshape(-1, LINE)[:, 2:4].sum(axis=0)
    assert per_thread[0] > 0 and per_thread[1] > 0, per_thread


def test_declines_what_it_does_not_cover(monkeypatch: pytest.MonkeyPatch) -> None:
    assert LS.LanePlan.of(synthetic_model()) is None  # plain float32 weights: the generic forward
    count = _Count(monkeypatch)
    s = Session(synthetic_model())
    s.prefill([1, 2, 3])
    s.step(4)
    assert count.calls == 0


@pytest.mark.oracle
def test_declines_moe_and_the_off_switch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from support.ggufgen import random_hf_model, write_gguf

    q8 = lambda name, a: (quantize_as(QT.Q8_0, a), QT.Q8_0)  # noqa: E731
    moe = load_model(str(write_gguf(random_hf_model("qwen3moe"), "qwen3moe", tmp_path / "moe.gguf", quant=q8)),
                     resident=True, progress=False)
    assert LS.LanePlan.of(moe) is None  # router + experts: the generic forward's moe_ffn
    dense = load_model(str(write_gguf(random_hf_model("llama"), "llama", tmp_path / "l.gguf", quant=q8)),
                       resident=True, progress=False)
    assert LS.LanePlan.of(dense) is not None
    monkeypatch.setenv("FAK_LANE_KERNEL", "0")
    assert LS.LanePlan.of(dense) is None


@pytest.mark.gemma
@pytest.mark.slow
def test_gemma_decode_through_the_lane_kernel_is_bit_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemma 3 270M's Q4_K_M mix (Q5_0, Q8_0, Q4_K, Q6_K tiles, fused Q/K(/V) and gate/up), 40 steps."""
    model = load_model("gemma3-270m", resident=True, progress=False)
    count = _Count(monkeypatch)
    prompt = [2, 651, 6037, 529, 9405, 563, 496, 1310] * 3
    assert model.lane_plan().head >= 0  # type: ignore[union-attr]  # the tied Q8_0 head runs in the kernel too
    on = _decode(model, prompt, 40, lane=True)
    assert count.calls == 40
    assert np.array_equal(on, _decode(model, prompt, 40, lane=False))
