"""`fak chat`: not landed yet."""

from __future__ import annotations

import typer

from commands.notlanded import not_landed


def register(app: typer.Typer) -> None:
    @app.command("chat", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def chat(ctx: typer.Context) -> None:
        """Not implemented yet: its issue has not landed."""
        not_landed("chat")
