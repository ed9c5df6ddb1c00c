"""`fak run MODEL PROMPT`: owned by the model issue."""

from __future__ import annotations

from commands.notlanded import not_landed


def run_model(model, prompt, **kw) -> None:  # type: ignore[no-untyped-def]
    not_landed("run MODEL")
