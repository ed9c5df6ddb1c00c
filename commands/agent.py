"""`fak agent`: not landed yet (its module keeps the subcommand's name for when its issue lands)."""

from __future__ import annotations

import typer

from commands.notlanded import register_placeholder


def register(app: typer.Typer) -> None:
    register_placeholder(app, "agent")
