"""A subcommand whose issue has not landed says so in one line and exits 2."""

from __future__ import annotations

import typer


def not_landed(name: str) -> None:
    typer.echo(f"fak {name}: not implemented yet (its issue has not landed)", err=True)
    raise typer.Exit(2)


def register_placeholder(app: typer.Typer, name: str) -> None:
    """Register `fak NAME` as a placeholder that takes any arguments and says it has not landed."""

    @app.command(name, context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                 help="Not implemented yet: its issue has not landed.")
    def placeholder(ctx: typer.Context) -> None:
        not_landed(name)
