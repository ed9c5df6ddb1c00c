"""Simple shell text -> simple commands, without tree-sitter: the shapes agents send most.

`cd src && pytest -q tests/test_app.py 2>&1 | tail -20`, `rg -n 'def main' --glob '*.py' | head`,
`git diff --stat; git status --short`: words of plain characters and plain quotes, joined by `&&`, `||`,
`;` and `|`, with `N>file`, `>>file`, `<file` and `N>&M` redirects. Nothing in such text expands (no `$`,
backquote, backslash, brace, parenthesis, `!`, newline or leading NAME=; a `#` comment is dropped), so its
words are what bash would pass, and the Walker's commands can be built directly: the same Cmd records
(Walker.emit links the pipeline and follows `cd`; `~` resolved) the parser's walk gives, at a fraction of
its cost. Anything else returns None and takes the parser (tests/fak/core/shell/test_shell_simple.py
proves both give the same effects on every such command of the corpora).
"""

from __future__ import annotations

import re

from fak.core.shell.parse import Cmd, Redirect, Walker, Word
from fak.core.shell.targets import Where, resolve

_CH = r"[A-Za-z0-9_./:,+@%^=~*?-]"  # characters that mean themselves outside quotes (glob ones stay literal)
# One token each: an operator, a redirect's operator, a word (plain characters and plain quotes, joined), or any
# other single character (which makes the text not simple). Blanks between tokens are skipped by findall.
_TOKENS = re.compile(rf"&&|\|\||;|\||[0-9]?(?:>>|>&|>|<)|(?:{_CH}|'[^']*'|\"[^\"$`\\!]*\")+|\S")
_OPS = frozenset({"&&", "||", ";", "|"})
_REDIRS = frozenset({">", ">>", ">&", "<"})
_RESERVED = frozenset({"if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done", "case", "esac", "in",
                       "function", "select", "time", "coproc", "{", "}", "!", "[[", "]]"})
_WORD_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./:,+@%^=~*?-'\"")
_COMMENT = re.compile(r"(?:^|(?<=[ \t]))#")
_QUOTED = re.compile(r"'([^']*)'|\"([^\"]*)\"")


def simple(text: str, where: Where) -> Walker | None:
    """The Walker the parser would give for `text`, or None when the text is not of the simple shape."""
    if "\n" in text or "\r" in text or "\x0b" in text or "\x0c" in text:
        return None
    cut = _COMMENT.search(text) if "#" in text else None
    if cut is not None:  # `# ...` to the end is a comment; one inside quotes leaves a quote open, and None below
        text = text[:cut.start()]
    w = Walker(where)
    argv: list[Word] = []
    redirects: list[Redirect] = []
    members: list[Cmd] = []  # the pipeline being read
    prev_op: str | None = None
    tokens = _TOKENS.findall(text)
    tokens.append("")  # the end closes the last command
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if tok and tok not in _OPS:
            if tok[-1] in "<>&":  # a redirect's operator (only those end so), then its target
                op = tok.lstrip("0123456789")
                target = tokens[i] if i < len(tokens) else ""
                if op not in _REDIRS or not target or target[0] not in _WORD_START or target in ("'", '"'):
                    return None  # `&`, `&>`, `<<`, or no target: the parser decides
                redirects.append(Redirect(op, (_unquote(target, w, tilde=False),)))
                i += 1
                continue
            if tok[0] not in _WORD_START or tok in ("'", '"'):
                return None  # a character the simple shape does not have, or a quote left open
            if not argv and ("=" in tok.split("'", 1)[0].split('"', 1)[0] or tok in _RESERVED):
                return None  # NAME=value before a command sets its environment; `while`, `if` ... are syntax
            argv.append((_unquote(tok, w, tilde=True),))
            continue
        op_or_end = tok or None
        if argv:
            members.append(w.emit(Cmd(argv, w.where, redirects, {}, members[-1] if members else None)))
        elif redirects or not (op_or_end is None and prev_op == ";"):
            return None  # nothing before a separator (only a last `;` may close nothing)
        argv, redirects = [], []
        if op_or_end != "|":
            _link(members)
            members = []
        prev_op = op_or_end
    return w


def _link(members: list[Cmd]) -> None:
    if len(members) > 1:
        for m in members:
            m.pipeline = members


def _unquote(raw: str, w: Walker, tilde: bool) -> str:
    """A word's text as bash passes it: quotes removed; a leading unquoted `~` resolved in an argument."""
    s = _QUOTED.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), raw) if ("'" in raw or '"' in raw) else raw
    return resolve(s, w.where) if tilde and raw.startswith("~") else s
