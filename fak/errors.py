"""Errors the kernel reports to a user as one line (the CLI maps them to exit 2)."""


class FakError(Exception):
    """A user-facing error: bad input file, unknown engine, bad policy. str() is the one line."""
