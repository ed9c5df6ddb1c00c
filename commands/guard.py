"""`fak guard`: not landed yet."""

from __future__ import annotations

import typer

from commands.notlanded import not_landed


def register(app: typer.Typer) -> None:
    @app.command("guard", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def guard(ctx: typer.Context) -> None:
        """Not implemented yet: its issue has not landed."""
        not_landed("guard")
