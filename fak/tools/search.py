"""Glob and Grep, confined to the root: a match that resolves outside it (a symlink out) is skipped."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fak.tools.confine import Root, ToolError, need_str

MAX_MATCHES = 500  # Glob paths / Grep lines listed before the listing is cut
SKIP_DIRS = frozenset({".git", "__pycache__", "node_modules", ".venv"})


def _inside(root: Root, p: Path) -> bool:
    real = Path(os.path.realpath(p))
    return real == root.path or root.path in real.parents


def _base(root: Root, args: dict[str, Any]) -> Path:
    given = need_str(args, "path", optional=True)
    base = root.resolve(given) if given else root.path
    if not base.exists():
        raise ToolError(f"{given}: no such file or directory")
    return base


def glob(root: Root, args: dict[str, Any]) -> str:
    """`{"pattern", "path"?}`: paths matching a glob (`**` crosses directories), relative to the root."""
    pattern = need_str(args, "pattern") or ""
    if os.path.isabs(pattern) or ".." in Path(pattern).parts:
        raise ToolError(f"pattern {pattern!r}: outside the working directory (patterns are relative to it)")
    base = _base(root, args)
    if not base.is_dir():
        raise ToolError(f"{args.get('path')}: not a directory")
    hits = sorted(root.rel(p) for p in base.glob(pattern) if _inside(root, p) and not SKIP_DIRS & set(p.relative_to(base).parts))
    if not hits:
        return "No files found"
    more = len(hits) - MAX_MATCHES
    return "\n".join(hits[:MAX_MATCHES]) + (f"\n... ({more} more)" if more > 0 else "")


def _files(root: Root, base: Path) -> Iterator[Path]:
    if base.is_file():
        yield base
        return
    for dirpath, dirnames, filenames in os.walk(base):  # os.walk does not follow symlinked dirs
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for f in sorted(filenames):
            p = Path(dirpath) / f
            if _inside(root, p):
                yield p


def grep(root: Root, args: dict[str, Any]) -> str:
    """`{"pattern", "path"?, "glob"?}`: lines matching a regular expression, as `path:line:text`."""
    pattern = need_str(args, "pattern") or ""
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise ToolError(f"pattern {pattern!r}: {exc}") from None
    name_glob = need_str(args, "glob", optional=True)
    base = _base(root, args)
    out: list[str] = []
    total = 0
    for p in _files(root, base):
        rel = root.rel(p)
        if name_glob and not (fnmatch.fnmatch(p.name, name_glob) or fnmatch.fnmatch(rel, name_glob)):
            continue
        try:
            data = p.read_bytes()
        except OSError:
            continue
        if b"\x00" in data[:8192]:
            continue  # binary
        for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
            if rx.search(line):
                total += 1
                if len(out) < MAX_MATCHES:
                    out.append(f"{rel}:{n}:{line[:500]}")
    if not out:
        return "No matches found"
    return "\n".join(out) + (f"\n... ({total - len(out)} more matches)" if total > len(out) else "")
