"""A subcommand whose issue has not landed says so in one line and exits 2."""

from __future__ import annotations

import typer


def not_landed(name: str) -> None:
    typer.echo(f"fak {name}: not implemented yet (its issue has not landed)", err=True)
    raise typer.Exit(2)
