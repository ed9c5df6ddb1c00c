"""What a decode step costs by its rows: the staircase speculation chooses draft lengths on.

The resident tile kernels meet each weight tile in lane groups (engine/kernels/tilegemm.py: 8 at a time,
then a 4, a 2, then 1s; `resident.PAD_LANES` pads 3 rows to 4 and 6-7 to 8), and a group's pass costs about
the same whatever its fill. So a step's cost is not a + b * rows but steps: on a Zen 4 host, Qwen 2.5 0.5B
with 500 tokens of context, 8 rows cost 18.2 ms and 9 rows 21.9 (a pass of 8 and a pass of 1), 16 rows
33.8 and 17 rows 37.0. And the steps are the host's: an AVX2 host without VNNI (Zen 2) spends ~10 ms a
row where Zen 4 spends ~2, against a read of the weights ~2.4x slower (bench/spec_rows.py prints both).
So the costs are measured on the model and host they serve (`measure`, once per model at the
scheduler's warm-up), from ten steps: 1, 2, 4 and 8 rows directly, the passes of 8, 4, 2 and 1 as
what 16, 12, 10 and 9 rows add to 8, and from 32 rows (WIDE) what 16 rows more add, timed as 32 and 64
rows (an AMX host's tile unit takes 16-row groups there, at ~0.8x what passes of 8 cost).

And each row attends to its lane's context: the staircase is timed at a short one, and what a row adds per
position past it (`attention`, ms per 1000) is timed too, from 8 rows at two contexts. It is not small: on
an Intel Xeon (AVX-512) host, Qwen 2.5 0.5B, ~1.7 ms a row per 1000 positions, so at 4096 positions a
one-lane 8-row verification step costs 81 ms where the staircase alone says 29 (bench/spec_rows.py
--context 4096): an agent's long prompt makes every draft row cost several weight-read rows. And each lane
of a step costs something of its own (its table, its attention call's share, its logits' handling: `lane`,
timed as 4 lanes of a row against one lane of 4 rows), ~0.6 ms there: 16 lanes cost ~9 ms more than 16 rows
of one lane, which made a 16-lane step look cheaper than it is and its drafts dearer beside it.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import numpy as np

from engine.kernels.tilegemm import AMX_MIN_LANES, LANES
from engine.model.resident import PAD_LANES

GROUPS = (8, 4, 2, 1)  # the tile kernels' lane groups, widest first
# Rows from which a step's cost is timed as such, not summed from passes of 8: on an AMX host the tile
# kernels take groups of LANES (16) lanes on the tile unit from AMX_MIN_LANES (32) rows, and there 48 to 96
# rows cost 10-21% less than the passes of 8 said (bench/spec_rows.py, 16 lanes of 600 positions): a
# 16-lane step drafted too little.
WIDE = AMX_MIN_LANES


def lane_groups(rows: int) -> list[int]:
    """The passes a step of `rows` rows makes over each weight tile: groups of 8, then what is left as
    the tile kernels take it after padding."""
    groups = [8] * (rows // 8)
    rest = rows % 8 + PAD_LANES.get(rows % 8, 0)
    for g in GROUPS:
        groups += [g] * (rest // g)
        rest %= g
    return groups


@dataclass(frozen=True)
class StepCosts:
    """ms of a step: `small` for steps of 1, 2, 4 and 8 rows (fewer than two passes of 8: their read of the
    weights is not all hidden behind compute), and past 8 rows what each further pass of 8, 4, 2 or 1 adds;
    all timed with rows at `context` positions of one lane. `attention`: ms a row adds per 1000 positions past
    that; `lane`: ms each lane past the first adds; `wide`: steps of WIDE rows and more, timed."""

    small: dict[int, float]
    passes: dict[int, float]
    attention: float = 0.0
    context: int = 0
    lane: float = 0.0
    wide: tuple[float, float] = (0.0, 0.0)  # (ms of WIDE rows, ms each LANES rows past them add); 0: passes of 8
    # ms a lane's first row adds per 1000 positions of its context on top of `attention`: a lane's first row
    # reads its keys and values, its further rows share each chunk of them (engine/kernels/attention.py), and
    # `attention` is timed as 8 rows of one lane. 16 lanes of 600 positions, timed on the loop thread: a plain
    # step 79 ms, said 72 without it (80 with), and 32 rows 1.33x that, said 1.54x (1.48x with it): the base
    # step looked cheap and its first draft rows dear
    first: float = 0.0

    def __call__(self, rows: int, positions: int = 0, lanes: int = 1, held: int = 0) -> float:
        """A step of `rows` rows of `lanes` lanes, attending to `positions` positions in all (the sum over its
        rows), the lanes holding `held` positions in all before it (what their first rows attend to)."""
        # called once a candidate draft token each step, and a mixed step's rows run to hundreds: the full
        # passes of 8 are counted, not listed
        if rows <= 0:
            return 0.0
        extra = (self.attention * max(0, positions - rows * self.context) + self.first * max(0, held - lanes * self.context)
                 ) / 1000 + self.lane * max(0, lanes - 1)
        if rows < 8:
            head, *more = lane_groups(rows)
            return self.small[head] + sum(self.passes[g] for g in more) + extra
        if rows >= WIDE and self.wide[0] > 0:
            # groups of LANES rows past WIDE, the rest as passes of 8, 4, 2, 1 but never dearer than a group
            # (on AMX 15 rows are padded to 16 and take one)
            at, per_group = self.wide
            rest = min(per_group, sum(self.passes[g] for g in lane_groups(rows % LANES)))
            return at + per_group * ((rows - WIDE) // LANES) + rest + extra
        return (self.small[8] + self.passes[8] * (rows // 8 - 1) + sum(self.passes[g] for g in lane_groups(rows % 8))
                + extra)


def rows_reach(held: int, rows: int) -> int:
    """Positions in all that `rows` rows fed after `held` positions of their lane attend to (row j: held + j)."""
    return rows * held + rows * (rows + 1) // 2


# Qwen 2.5 0.5B resident on a Zen 4 host, 500 tokens of context (the figures above): what a scheduler
# that did not warm up (tests, mostly) assumes. The 2-lane group came later: its figures are what 2 rows
# cost padded to 4 then (an upper bound, not a measurement). Attention was not timed there: no term.
ZEN4_QWEN = StepCosts(small={1: 9.2, 2: 13.1, 4: 13.1, 8: 18.2}, passes={8: 15.6, 4: 8.0, 2: 8.0, 1: 3.5})

_measured: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def measure(model: object, context: int = 64, reps: int = 5, far: int = 512) -> StepCosts:
    """The step costs of `model` on this host (cached per model): one scratch session of `context`
    tokens, every row asking for logits as a verification's do, the median of `reps` runs a size; beside
    them 4 such sessions a row each (against one of 4 rows: the lane term), and 8 rows of a session `far`
    positions longer (the attention term)."""
    if model in _measured:
        return _measured[model]
    from engine.model.scratch import Scratch
    from engine.model.session import Session, forward_batch

    limit = getattr(getattr(model, "config", None), "context_length", 0) or context + far + 16
    far = max(0, min(far, limit - context - 16))  # a model with a short context: a shorter reach
    near = [Session(model) for _ in range(4)]  # type: ignore[arg-type]
    reach = Session(model) if far else None  # type: ignore[arg-type]
    sessions = near + ([reach] if reach is not None else [])
    try:
        for s in sessions:
            s.prefill(np.arange(context) % 97 + 3)
        if reach is not None:
            reach.prefill(np.arange(far) % 89 + 7)
        # the groups' own steps, then 8 + a pass of each group: 16, 12, 10 and 9 rows; 4 lanes of a row;
        # 8 rows `far` positions on
        steps: dict[object, tuple[list[Session], list[int]]] = {
            rows: (near[:1], [rows]) for rows in sorted(set(GROUPS) | {8 + g for g in GROUPS} | {WIDE, 2 * WIDE})}
        steps["lanes"] = (near, [1] * 4)
        if reach is not None:
            steps["far"] = ([reach], [8])
            steps["far1"] = ([reach], [1])
        times: dict[object, list[float]] = {k: [] for k in steps}
        out = Scratch()  # the logits land where the scheduler's do: in a buffer kept across steps
        for _ in range(reps):  # the steps take turns: a drift of the host's speed lands on all of them alike
            for k, (ss, rows) in steps.items():
                held = [s.length for s in ss]
                t = time.perf_counter()
                forward_batch(ss, [[5] * r for r in rows], rows, out=out)
                times[k].append(time.perf_counter() - t)
                for s, at in zip(ss, held, strict=True):
                    s.truncate(at)
        ms = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    finally:
        for s in sessions:
            s.free()
    lane = max(0.0, (ms["lanes"] - ms[4]) / 3)
    far_ms = ms.get("far", 0.0)
    floor = 0.01 * ms[1]  # a noisy run must not make a pass free (or cheaper than nothing)
    small, most = {}, 0.0
    for g in sorted(GROUPS):  # more rows never cost less: a noisy smaller step sets the floor
        most = small[g] = max(ms[g], most)
    attention = max(0.0, (far_ms - ms[8]) / (8 * far) * 1000) if far else 0.0  # ms a row per 1000 positions
    # a lone row's attention per 1000 positions, past what a row sharing its lane's chunks costs
    first = max(0.0, (ms["far1"] - ms[1]) / far * 1000 - attention) if far else 0.0
    wide = (max(ms[WIDE], small[8]), max((ms[2 * WIDE] - ms[WIDE]) / (WIDE // LANES), floor))
    costs = StepCosts(small=small, passes={g: max(ms[8 + g] - ms[8], floor) for g in GROUPS}, attention=attention,
                      context=context, lane=lane, wide=wide, first=first)
    _measured[model] = costs
    return costs
