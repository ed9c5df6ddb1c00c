"""apply_patch bodies and single paths -> effects (the file tools' side of the model)."""

from __future__ import annotations

import re

from fak.core.shell.effect import Effect
from fak.core.shell.targets import Where, classify, display, is_history, is_persist, resolve

_PATCH_HDR = re.compile(r"^\*\*\* (Add|Update|Delete) File: (.+?)\s*$|^\*\*\* Move to: (.+?)\s*$", re.M)


def patch_effects(body: str, where: Where, how: str = "apply_patch") -> list[Effect]:
    out: list[Effect] = []
    for m in _PATCH_HDR.finditer(body):
        if m.group(1):
            out += path_effects("delete" if m.group(1) == "Delete" else "write", m.group(2), where, how)
        else:
            out += path_effects("write", m.group(3), where, how)
    return out


def path_effects(kind: str, path: str, where: Where, how: str) -> list[Effect]:
    p = resolve(path, where)
    cls = classify(p, where)
    shown = display(p, where)
    if kind == "read":
        return [Effect("read-secret", shown, cls, how)] if cls == "credential" else []
    if kind == "write" and is_persist(p, where):
        return [Effect("persist", shown, cls, how)]
    if is_history(p, where):
        return [Effect("tamper", shown, cls, how)]
    return [Effect(kind, shown, cls, how)]


