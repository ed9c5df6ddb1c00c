"""Confinement: every path a tool touches resolves (symlinks included) to somewhere under the root.

This is the engine's own floor, not policy: a policy judges what a call means; confinement makes sure
that whatever runs cannot name a file outside the working directory (`..`, an absolute path elsewhere,
a symlink pointing out). Bash is confined by cwd and environment only; the kernel's policy judges it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class ToolError(Exception):
    """A tool call that cannot run (bad arguments, a path outside the root, a missing file): its str()
    becomes the error Result's message."""


class Root:
    """The working directory (`path`, symlinks resolved) and the sandbox's home, which `~` names."""

    def __init__(self, root: str | os.PathLike[str], home: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(os.path.realpath(root))
        if not self.path.is_dir():
            raise ToolError(f"{root}: not a directory")
        self.home = Path(os.path.realpath(home)) if home is not None else self.path

    def resolve(self, given: str) -> Path:
        """`given` (relative to the root, absolute, or `~/...`) as a real path under the root, else ToolError."""
        if not given:
            raise ToolError("empty path")
        if "\x00" in given:
            raise ToolError("path contains a NUL byte")
        p = given
        if p == "~" or p.startswith("~/"):
            p = str(self.home) + p[1:]
        full = Path(p) if os.path.isabs(p) else self.path / p
        real = Path(os.path.realpath(full))  # resolves every symlink on the way, existing or not
        if real != self.path and self.path not in real.parents:
            raise ToolError(f"{given}: outside the working directory {self.path}")
        return real

    def rel(self, p: Path) -> str:
        """A path under the root as the tools print it (relative; "." for the root)."""
        try:
            r = p.relative_to(self.path)
        except ValueError:
            return str(p)
        return str(r) or "."


def need_str(args: dict[str, Any], key: str, *, optional: bool = False) -> str | None:
    v = args.get(key)
    if v is None:
        if optional:
            return None
        raise ToolError(f"missing argument {key!r}")
    if not isinstance(v, str):
        raise ToolError(f"argument {key!r}: expected a string, got {type(v).__name__}")
    return v


def need_int(args: dict[str, Any], key: str, *, minimum: int = 0) -> int | None:
    v = args.get(key)
    if v is None:
        return None
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():  # small models quote numbers
        v = int(v)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise ToolError(f"argument {key!r}: expected an integer >= {minimum}, got {v!r}")
    return v
