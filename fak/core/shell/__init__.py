"""The shell model: a command (text or an argv list) -> the effects it would have on which targets.

    effects("rm -rf ${HOME:?}/", Where(cwd="/work/proj", home="/home/dev"))
    -> [Effect("delete", "~", "home", "rm -r")]

Unparseable text raises ShellParseError: the policy fails closed on it.
"""

from __future__ import annotations

from fak.core.shell.commands import Judge
from fak.core.shell.effect import CLASSES, KINDS, SENSITIVE, Effect
from fak.core.shell.parse import ShellParseError
from fak.core.shell.targets import Where


def effects(command: str | list[str], where: Where) -> list[Effect]:
    j = Judge()
    if isinstance(command, list):
        j.argv([str(a) for a in command], where)
    else:
        j.script(command, where)
    return j.out


__all__ = ["CLASSES", "KINDS", "SENSITIVE", "Effect", "ShellParseError", "Where", "effects"]
