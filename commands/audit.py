"""`fak audit`: journal tools."""

from __future__ import annotations

import typer

from commands.notlanded import not_landed

app = typer.Typer(help="Journal tools.", no_args_is_help=True)


@app.command("verify")
def verify(file: str) -> None:
    """Verify a hash-chained journal."""
    not_landed("audit verify")
