"""Required literals of a regex: the decision fast path.

`needles(pattern)` returns literal strings of which every match of the pattern contains at least one
(or None when that cannot be shown). A policy rule whose needles are all absent from a text cannot
match it, so its regex is not run: an ordinary command is cleared by a few substring scans. The
needles are derived from the parsed regex, never written by hand, so they cannot drift from the rule.
"""

from __future__ import annotations

import re
import re._constants as _C  # the regex parser (private, but stable across 3.11+)
import re._parser as _sre_parse
from typing import Any

_GLOBAL_FLAGS = re.compile(r"^\(\?([aiLmsux]+)\)")


def needles(pattern: str) -> tuple[str, ...] | None:
    """Literal strings of which every match of `pattern` contains at least one (None: unknown).

    This is the decision fast path: a rule whose needles are all absent from the text cannot match,
    so its regex is not run. Derived from the parsed regex, never hand-written, so it cannot drift."""
    try:
        parsed = _sre_parse.parse(pattern)
    except re.error:
        return None
    if parsed.state.flags & (re.IGNORECASE | re.VERBOSE):
        return None
    return _seq_needles(list(parsed))


def _seq_needles(seq: list[tuple[Any, Any]]) -> tuple[str, ...] | None:
    candidates: list[tuple[str, ...]] = []
    run: list[str] = []

    def flush() -> None:
        if run:
            candidates.append(("".join(run),))
            run.clear()

    for op, av in seq:
        if op is _C.LITERAL:
            run.append(chr(av))
            continue
        flush()
        inner: tuple[str, ...] | None = None
        if op is _C.SUBPATTERN:
            _group, add_flags, _del, sub = av
            if not add_flags & (re.IGNORECASE | re.VERBOSE):
                inner = _seq_needles(list(sub))
        elif op is _C.ATOMIC_GROUP:
            inner = _seq_needles(list(av))
        elif op is _C.BRANCH:
            alts = [_seq_needles(list(b)) for b in av[1]]
            if all(a is not None for a in alts):
                inner = tuple(x for a in alts for x in a)  # type: ignore[union-attr]
        elif op in (_C.MAX_REPEAT, _C.MIN_REPEAT, _C.POSSESSIVE_REPEAT) and av[0] >= 1:
            inner = _seq_needles(list(av[2]))
        if inner:
            candidates.append(inner)
    flush()
    good = [c for c in candidates if all(c)]
    # Most selective: longest shortest-needle, then fewest needles.
    return max(good, key=lambda c: (min(map(len, c)), -len(c))) if good else None


def minimal(needles: tuple[str, ...]) -> list[str]:
    """Drop needles that contain another needle: finding the shorter one is implied."""
    uniq = sorted(set(needles), key=len)
    return [n for i, n in enumerate(uniq) if not any(m in n for m in uniq[:i])]


def combine(patterns: list[str]) -> re.Pattern[str]:
    """One alternation of several regexes; a leading global flag group becomes a scoped one."""
    parts = []
    for p in patterns:
        m = _GLOBAL_FLAGS.match(p)
        parts.append(f"(?{m.group(1)}:{p[m.end():]})" if m else f"(?:{p})")
    return re.compile("|".join(parts))
