"""`fak doctor`: what this machine gives fak, in one screen (fak/runtime/doctor.py does the looking)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from fak.runtime.doctor import Report


def register(app: typer.Typer) -> None:
    @app.command("doctor")
    def doctor(
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object (for scripts)."),
        no_measure: bool = typer.Option(False, "--no-measure", help="Skip the memory-read measurement (a few s)."),
        warm: bool = typer.Option(False, "--warm", help="Compile and cache the kernels now (the first run's half minute) "
                                  "and assemble the default model, then check."),
    ) -> None:
        """What this machine gives fak: CPU, memory bandwidth and decode ceilings, models, kernel cache,
        sandbox, namespaces, Ray, chromium, disk. Exit 0 when the default paths have what they need."""
        from fak.runtime.doctor import ceiling, examine

        if warm:
            from fak.runtime.boot import boot

            b = boot(None, show=not as_json)
            if b.scheduler is not None:
                b.scheduler.close()
        report = examine(measure=not no_measure)
        if as_json:
            print(json.dumps(report.to_json()))
        else:
            _show(report, ceiling(report))
        raise typer.Exit(0 if report.ok else 1)


def _show(r: Report, ceilings: list[tuple[str, float]]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(file=sys.stdout, highlight=False)
    t = Table(title="fak doctor", show_header=True, header_style="bold", box=None, pad_edge=False)
    t.add_column("")
    t.add_column("check")
    t.add_column("found")
    for c in r.checks:
        mark = "[green]ok[/]" if c.ok else ("[red]MISSING[/]" if c.required else "[yellow]--[/]")
        t.add_row(mark, c.name, c.detail)
    con.print(t)
    fixes = [c for c in r.checks if c.fix]
    if fixes:  # below the table, one per line: a command is copied whole, never wrapped in a cell
        con.print("to fix:")
        for c in fixes:
            con.print(f"  {c.name}: [cyan]{c.fix}[/]", soft_wrap=True)
    gbps = r.read_gbps
    if gbps:
        line = f"memory read {gbps:.1f} GB/s (all {r.threads} threads)"
        if ceilings:
            line += "; decode ceiling " + ", ".join(f"{a} {tps:.0f} tok/s" for a, tps in ceilings)
        con.print(line)
    con.print("[green]ready[/]" if r.ok else "[red]not ready: run the fix next to each MISSING line[/]")
