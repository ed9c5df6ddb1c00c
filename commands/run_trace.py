"""`fak run --trace`: owned by the foundation issue."""

from __future__ import annotations

from commands.notlanded import not_landed


def run_trace(trace, **kw) -> None:  # type: ignore[no-untyped-def]
    not_landed("run --trace")
