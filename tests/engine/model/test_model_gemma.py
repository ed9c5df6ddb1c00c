"""The real Gemma 3 270M (plain float32): batched decode is bit-identical to serial decode."""

from __future__ import annotations

import numpy as np
import pytest

from engine import Session, load_model, step_batch
from engine.model.forward import Model

pytestmark = pytest.mark.gemma


@pytest.fixture(scope="module")
def model() -> Model:
    return load_model("gemma3-270m", progress=False)


@pytest.mark.slow
def test_step_batch_bit_identical_on_gemma(model: Model) -> None:
    prompts = [[2, 818], [2, 818, 5279, 529, 7001], [2, 105, 2364, 107, 3689, 563, 506, 5279, 529], [2] + list(range(300, 317))]
    serial, batch = [Session(model) for _ in prompts], [Session(model) for _ in prompts]
    toks = []
    for a, b, p in zip(serial, batch, prompts, strict=False):
        la, lb = a.prefill(p), b.prefill(p)
        assert np.array_equal(la, lb)
        toks.append(int(np.argmax(la)))
    for _ in range(2):
        got = step_batch(batch, toks)
        want = np.stack([s.step(t) for s, t in zip(serial, toks, strict=False)])
        assert np.array_equal(got, want)
        toks = [int(np.argmax(r)) for r in got]


def test_chunked_prefill_agrees(model: Model) -> None:
    p = [2, 105, 2364, 107, 3689, 563, 506, 5279, 529, 9405, 236881, 106, 107, 105, 4368, 107]
    one, two = Session(model), Session(model)
    l1 = one.prefill(p)
    two.prefill(p[:7])
    l2 = two.prefill(p[7:])
    np.testing.assert_allclose(l1, l2, atol=2e-3)
    assert int(np.argmax(l1)) == int(np.argmax(l2))
