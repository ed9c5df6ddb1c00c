"""The shell model: a command (text or an argv list) -> the effects it would have on which targets.

    effects("rm -rf ${HOME:?}/", Where(cwd="/work/proj", home="/home/dev"))
    -> [Effect("delete", "~", "home", "rm -r")]

Unparseable text raises ShellParseError: the policy fails closed on it.
"""

from __future__ import annotations

import re

from fak.core.shell.commands import Judge
from fak.core.shell.effect import CLASSES, KINDS, SENSITIVE, Effect
from fak.core.shell.parse import ShellParseError
from fak.core.shell.targets import Where

# Text bash would only split on blanks: no quoting, expansion, globbing, redirection or control operator
# (`git status --short`, `pytest -q tests/x.py`). Its words are its argv, so the parser is skipped.
_PLAIN = re.compile(r"[A-Za-z0-9_./:,+@%^-][A-Za-z0-9_./:,+@%^=\s-]*")
_COMMENT = re.compile(r"(?:^|\s)#.*$", re.S)


def effects(command: str | list[str], where: Where) -> list[Effect]:
    j = Judge()
    if isinstance(command, list):
        j.argv([str(a) for a in command], where)
        return j.out
    plain = _COMMENT.sub("", command) if "#" in command and "\n" not in command else command
    words = plain.split()
    if words and _PLAIN.fullmatch(plain.strip()) and "=" not in words[0]:
        j.argv(words, where)
    else:
        j.script(command, where)
    return j.out


__all__ = ["CLASSES", "KINDS", "SENSITIVE", "Effect", "ShellParseError", "Where", "effects"]
