"""`fak run --trace FILE`: replay a trace of tool calls through the kernel; a rich table or one JSON object."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fak.core.trace import Replay, build_kernel, load_trace, replay

_STYLE = {"ALLOW": "green", "DENY": "red", "TRANSFORM": "yellow", "QUARANTINE": "magenta"}


def run_trace(
    trace: Path,
    *,
    engine: str | None = None,
    policy: Path | None = None,
    journal: Path | None = None,
    gguf: str | None = None,
    resident: bool = True,
    sched: dict[str, Any] | None = None,
    as_json: bool = False,
) -> None:
    engine_id = engine or "mock"
    tr = load_trace(trace)  # validate the trace before building anything
    opts: dict[str, dict[str, Any]] = {"inkernel": {"gguf": gguf, "resident": resident, **(sched or {})}}
    kernel = build_kernel(engine_id, policy, journal, opts)
    eng = kernel.engine_for(engine_id)
    if callable(getattr(eng, "preload", None)):
        eng.preload()  # load the model (and KV pool) at boot: a bad model file or pool fails before any call
    try:
        result = replay(tr, kernel)
    finally:
        if kernel.journal is not None:
            kernel.journal.close()
    if as_json:
        print(json.dumps(result.to_json()))
    else:
        _render(result, str(trace), engine_id)


def _render(result: Replay, source: str, engine_id: str) -> None:
    probe = Console()
    # Full names beat a pretty fit: never narrower than the table needs (pipes default to 80 columns).
    console = Console(width=max(probe.width, 110))
    table = Table(title=f"{source} (engine: {engine_id})")
    for col in ("#", "tool", "verdict", "reason", "by", "status"):
        table.add_column(col)
    for r in result.rows:
        style = _STYLE.get(r.verdict, "")
        table.add_row(str(r.index), r.tool, f"[{style}]{r.verdict}[/]" if style else r.verdict, r.reason, r.by, r.status)
    console.print(table)
    console.print("  ".join(f"{k}={v}" for k, v in result.summary.items()))
