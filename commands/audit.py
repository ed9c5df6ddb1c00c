"""`fak audit verify FILE`: verify a hash-chained journal (exit 0 OK, 1 broken, 2 unreadable)."""

from __future__ import annotations

from pathlib import Path

import typer

from fak.core.journal import verify as verify_journal

app = typer.Typer(help="Journal tools.", no_args_is_help=True)


@app.callback()
def _audit() -> None:
    """Journal tools."""


@app.command("verify")
def verify(file: Path = typer.Argument(..., help="Journal JSONL written by --journal.")) -> None:
    """Verify a hash-chained journal: prints OK or the first broken line number."""
    report = verify_journal(file)  # FakError (unreadable file) -> one line, exit 2, via commands.main
    typer.echo(report.summary(str(file)))
    if not report.ok:
        raise typer.Exit(1)
