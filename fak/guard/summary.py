"""The summary a guard session ends with: one short rich table on stderr, or one JSON line; and the
banner's sandbox line (what the sandbox allows and refuses)."""

from __future__ import annotations

import json
import sys
from typing import Any

from fak.guard.state import Tally


def _short(path: str, home: str | None) -> str:
    return "~" + path[len(home):] if home and (path == home or path.startswith(home.rstrip("/") + "/")) else path


def banner_line(sandbox: dict[str, Any] | None, home: str | None) -> str:
    """One line: the sandbox's writable paths, hidden credential stores and network, or that it is off."""
    if sandbox is None:
        return "fak guard: sandbox off · the agent and what it runs have this user's files and network"
    rw = ", ".join(_short(p, home) for p in sandbox["rw"])
    hidden = sandbox["hidden"]
    hid = ", ".join(_short(p, home) for p in hidden[:4]) + (f" +{len(hidden) - 4}" if len(hidden) > 4 else "")
    net = "gateway only" + (f" + {', '.join(sandbox['allow_net'])} via proxy" if sandbox["allow_net"] else "")
    shown = sandbox.get("tmp_shown") or []
    tmp = "/tmp private" + (f" but {', '.join(_short(p, home) for p in shown)} read-only" if shown else "")
    return f"fak guard: sandbox on · rw {rw} · rest read-only · hidden {hid or 'none found'} · {tmp} · net: {net}"


def as_json(tally: Tally, *, agent: str, exit_code: int, journal: str | None,
            sandbox: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"fak_guard": "summary", "agent": agent, "exit_code": exit_code, **tally.to_json(),
                           "journal": journal, "sandbox": sandbox}
    if journal:
        out["verify"] = f"fak audit verify {journal}"
    return out


def show(tally: Tally, *, agent: str, exit_code: int, journal: str | None, json_line: bool,
         sandbox: dict[str, Any] | None = None, home: str | None = None) -> None:
    if json_line:
        sys.stderr.write(json.dumps(as_json(tally, agent=agent, exit_code=exit_code, journal=journal,
                                            sandbox=sandbox)) + "\n")
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
    if sandbox is not None:
        line = (f"sandbox: rw {', '.join(_short(p, home) for p in sandbox['rw'])} · hidden {len(sandbox['hidden'])} "
                f"credential stores · network refused [red]{sandbox['net_refused']}[/]")
        if sandbox["net_allowed"]:
            line += " · allowed " + ", ".join(f"{h} ×{n}" for h, n in sandbox["net_allowed"].items())
        con.print(line, soft_wrap=True)
        for h, n in sandbox["net_refused_hosts"].items():  # each with the proxy's reason
            con.print(f"  refused {h} ×{n}: {sandbox['net_refused_reasons'][h]}", soft_wrap=True, markup=False)
    else:
        con.print("sandbox: off", soft_wrap=True)
    if journal:
        con.print(f"journal {journal} · verify: [bold]fak audit verify {journal}[/]", soft_wrap=True)  # one line to copy
