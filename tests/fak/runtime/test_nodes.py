"""fak/runtime/nodes.py: the one node builder behind `fak worker` and the Ray actors. A stage keeps only the
weights of its band; prefill and decode nodes build, listen and warm; bad input is one FakError line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.model.synthetic import synthetic_model
from fak.errors import FakError
from fak.runtime.nodes import build_node, held_layers


def _booted() -> SimpleNamespace:
    return SimpleNamespace(model=synthetic_model(), tokenizer=None)


@pytest.mark.parametrize("band", [(0, 1), (1, 2), (1, 3)])
def test_a_stage_holds_only_its_band(band: tuple[int, int]) -> None:
    b = _booted()
    n = b.model.config.n_layers
    node = build_node("stage", b, name="s", layers=band)
    try:
        w = b.model.weights
        assert held_layers(b.model) == list(range(*band))
        assert all((w.layers[i] is None) != (band[0] <= i < band[1]) for i in range(n))
        last = band[1] == n
        assert (w.token_embd is not None) == last and (w.output is not None) == last
    finally:
        node.close()


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_prefill_and_decode_nodes_build(role: str) -> None:
    b = _booted()
    node = build_node(role, b, block_tokens=16, shm_bytes=1 << 20)
    try:
        assert node.address[1] > 0 and node.name == f"{role}-0"
        assert held_layers(b.model) == list(range(b.model.config.n_layers))  # not a stage: every layer
    finally:
        node.close()


def test_errors_are_one_line() -> None:
    with pytest.raises(FakError, match="--role 'x'"):
        build_node("x", _booted())
    with pytest.raises(FakError, match=r"^--layers 2:1: "):
        build_node("stage", _booted(), layers=(2, 1))
    with pytest.raises(FakError, match=r"^--listen 203\.0\.113\.1:0: listening beyond loopback needs the cluster key"):
        build_node("stage", _booted(), host="203.0.113.1", layers=(0, 1))
    with pytest.raises(FakError, match=r"^--listen 203\.0\.113\.1:0: "):  # keyed: the address itself is refused
        build_node("stage", _booted(), host="203.0.113.1", layers=(0, 1), key=b"k" * 32)
