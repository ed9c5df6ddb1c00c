"""Errors the engine reports to a user as one line: they name the file and the problem."""


class EngineError(Exception):
    """A user-facing engine error (bad GGUF, unsupported architecture, bad request)."""


class GGUFError(EngineError):
    """The GGUF file is unreadable, truncated, or describes something we do not support."""
