"""Sibling weights that read the same input, fused at load: one product launch instead of two or three.

Why: a product call costs ~5-10 us beyond its bytes (dispatch, the thread team, the split over two
threads; measured from DRAM: 1 MiB takes ~48 us where 8 MiB stream at ~25 GB/s), and a Gemma 3 270M
decode step made ~130 of them. Q and K (and V when it
has the same layout), gate and up, multiply the same normed row; when their tiles share a layout and a
row length they are laid end to end in ONE buffer, each member's `raw` a view of its band, so a single
`gemm_tiles` call over the whole buffer computes every member. Tiles are independent of each other, so
each output element is the same bits fused or apart (tests/engine/model/test_fuse.py), and the members still work on
their own (a pipeline stage, the diagnostics, a test).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.model.resident import TILED, QuantWeight


@dataclass(eq=False)
class FusedWeight:
    """Members whose tiles lie end to end in `whole.raw`; member i's outputs are columns bounds[i]:bounds[i+1].
    The members are held weakly (each member holds its group): a layer a pipeline stage drops is freed at
    once, not at the next cycle collection."""

    whole: QuantWeight
    refs: tuple[weakref.ref[QuantWeight], ...]
    bounds: tuple[int, ...]

    def leads(self, ws: Sequence[Any]) -> bool:
        """ws begins with the members, in order."""
        return len(ws) >= len(self.refs) and all(r() is w for r, w in zip(self.refs, ws, strict=False))


def fusable(ws: Sequence[Any]) -> bool:
    """Tiled, one layout and row length, and every member but the last a whole number of tiles (a padded
    tile in the middle would shift the next member's rows)."""
    if len(ws) < 2 or not all(isinstance(w, QuantWeight) and w.layout.endswith(TILED) for w in ws):
        return False
    first = ws[0]
    return (all(w.layout == first.layout and w.shape[1] == first.shape[1] and w.group is None for w in ws)
            and all(w.shape[0] % 16 == 0 for w in ws[:-1]))


def fuse(ws: Sequence[Any]) -> FusedWeight | None:
    """Lay the tiles of `ws` end to end (one copy at load; the members' own buffers are then freed)."""
    if not fusable(ws):
        return None
    raw = np.concatenate([w.raw for w in ws])
    raw.setflags(write=False)  # one kernel specialization, as for every resident weight
    rows = sum(w.shape[0] for w in ws)
    whole = QuantWeight("+".join(w.name for w in ws), ws[0].qtype, raw, (rows, ws[0].shape[1]), ws[0].layout)
    bounds, t0 = [0], 0
    for w in ws:
        t1 = t0 + int(w.raw.shape[0])
        w.raw = raw[t0:t1]
        t0 = t1
        bounds.append(bounds[-1] + w.shape[0])
    g = FusedWeight(whole, tuple(weakref.ref(w) for w in ws), tuple(bounds))
    for w in ws:
        w.group = g
    return g


def fuse_siblings(ws: Sequence[Any]) -> None:
    """Fuse the longest run of `ws` (in order) that can be: all of them, else the first two, else the last two."""
    for run in (ws, ws[:2], ws[1:]):
        if len(run) >= 2 and fuse(run) is not None:
            return


def product_runs(ws: Sequence[Any]) -> list[tuple[Any, FusedWeight | None]]:
    """The products that computing every w of `ws` takes, in order: (a fused group's whole, the group) for
    each run of members that leads a group, (w, None) for each other weight."""
    out: list[tuple[Any, FusedWeight | None]] = []
    i = 0
    while i < len(ws):
        g = getattr(ws[i], "group", None)
        if g is not None and g.leads(ws[i:]):
            out.append((g.whole, g))
            i += len(g.refs)
        else:
            out.append((ws[i], None))
            i += 1
    return out


def matmul_group(x: np.ndarray, ws: Sequence[Any], mm: Any) -> list[np.ndarray]:
    """x @ w.T for every w of `ws`: one launch per fused run, `mm` (the caller's product) for the rest.
    Fused outputs are column views of one [rows, total] array."""
    out: list[np.ndarray] = []
    for w, g in product_runs(ws):
        if g is not None:
            y = w.matmul(x)
            out.extend(y[:, a:b] for a, b in zip(g.bounds, g.bounds[1:], strict=False))
        else:
            out.append(mm(x, w))
    return out
