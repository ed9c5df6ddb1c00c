"""The summary a guard session ends with: one short rich table on stderr, or one JSON line."""

from __future__ import annotations

import json
import sys
from typing import Any

from fak.guard.state import Tally


def as_json(tally: Tally, *, agent: str, exit_code: int, journal: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"fak_guard": "summary", "agent": agent, "exit_code": exit_code, **tally.to_json(),
                           "journal": journal}
    if journal:
        out["verify"] = f"fak audit verify {journal}"
    return out


def show(tally: Tally, *, agent: str, exit_code: int, journal: str | None, json_line: bool) -> None:
    if json_line:
        sys.stderr.write(json.dumps(as_json(tally, agent=agent, exit_code=exit_code, journal=journal)) + "\n")
        sys.stderr.flush()
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"fak guard · {agent} exited {exit_code}", title_justify="left", box=None, pad_edge=False)
    for col in ("decisions", "allowed", "denied", "transformed", "quarantined", "results admitted"):
        t.add_column(col, justify="right")
    t.add_row(str(tally.decisions), f"[green]{tally.allowed}[/]", f"[red]{tally.denied}[/]", str(tally.transformed),
              f"[yellow]{tally.quarantined}[/]", str(tally.results_admitted))
    con = Console(stderr=True, highlight=False)
    con.print(t)
    if tally.reasons:
        con.print("refused: " + ", ".join(f"{r} ×{n}" for r, n in tally.reasons.most_common(5)))
    if journal:
        con.print(f"journal {journal} · verify: [bold]fak audit verify {journal}[/]", soft_wrap=True)  # one line to copy
