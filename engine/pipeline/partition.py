"""PartitionPlan: where a model's layers are cut into pipeline stages.

`PartitionPlan.by_bytes(model, n)` balances the stages by the bytes of their layers' weights (what a
decode step reads, so what a stage's step time follows); `PartitionPlan.at(model, [9, 18])` takes explicit
cut points. Either way the plan is checked against the model: increasing cuts strictly inside
1..n_layers-1, every stage at least one layer. The embedding and the LM head stay with the scheduler's
process (the head): a stage moves only hidden rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import EngineError


def layer_bytes(model: Any) -> list[int]:
    """Weight bytes of each layer (resident blocks or float32 arrays, whatever the model holds)."""
    out = []
    for lw in model.weights.layers:
        out.append(0 if lw is None else sum(int(getattr(v, "nbytes", 0)) for v in vars(lw).values() if v is not None))
    return out


@dataclass(frozen=True)
class PartitionPlan:
    n_layers: int
    cuts: tuple[int, ...]  # layer indices where a new stage starts

    def __post_init__(self) -> None:
        c, n = self.cuts, self.n_layers
        if any(not 0 < x < n for x in c):
            raise EngineError(f"pipeline cuts {list(c)}: each must be in 1..{n - 1} (the model has {n} layers)")
        if any(b <= a for a, b in zip(c, c[1:], strict=False)):
            raise EngineError(f"pipeline cuts {list(c)}: must increase (every stage needs at least one layer)")

    @property
    def bands(self) -> list[tuple[int, int]]:
        """[lo, hi) of each stage."""
        edges = [0, *self.cuts, self.n_layers]
        return list(zip(edges, edges[1:], strict=False))

    @property
    def stages(self) -> int:
        return len(self.cuts) + 1

    @classmethod
    def at(cls, model: Any, cuts: list[int]) -> PartitionPlan:
        return cls(int(model.config.n_layers), tuple(int(x) for x in cuts))

    @classmethod
    def by_bytes(cls, model: Any, stages: int, head_last: bool = True) -> PartitionPlan:
        """Cuts that balance the stages' weight bytes; with `head_last` the LM head counts on the last stage
        (engine/pipeline/pipeline.py runs it there)."""
        n = int(model.config.n_layers)
        if not 1 <= stages <= n:
            raise EngineError(f"--stages {stages}: expected 1..{n} (the model has {n} layers)")
        sizes = layer_bytes(model)
        if not sum(sizes):
            sizes = [1] * n  # nothing to weigh (no weights loaded): equal layer counts
        elif head_last:
            sizes[-1] += int(getattr(model.weights.output, "nbytes", 0) or 0)
        pref = [0]
        for b in sizes:
            pref.append(pref[-1] + b)
        cuts: list[int] = []
        for j in range(1, stages):  # each cut where the running bytes come closest to j/stages of the total
            target = pref[-1] * j / stages
            lo, hi = (cuts[-1] if cuts else 0) + 1, n - (stages - j)
            cuts.append(min(range(lo, hi + 1), key=lambda i: (abs(pref[i] - target), i)))
        return cls(n, tuple(cuts))

    @staticmethod
    def parse_cuts(text: str) -> list[int]:
        try:
            return [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise EngineError(f"--cuts {text!r}: expected layer indices like 9,18") from None
