"""Code written into a file (Write, Edit, apply_patch): the reverse shells and credential sends it carries.

Writing a script is not running it, so only what no project script has a reason to hold counts here: a shell
wired to a socket (a reverse shell, in shell or in code) and code that sends credentials out. Everything else
a script may do (`curl ... | sh` in a setup script, a tool that runs the command it is given) is judged when
it runs, by the floor and inside the sandbox.
"""

from __future__ import annotations

import posixpath
import re

from fak.core.shell.code import scan
from fak.core.shell.commands import Judge, _judge
from fak.core.shell.effect import Effect
from fak.core.shell.parse import ShellParseError
from fak.core.shell.targets import Where, classify, display, resolve

_BY_EXT = {".sh": "sh", ".bash": "sh", ".zsh": "sh", ".ksh": "sh", ".command": "sh", ".py": "python", ".pyw": "python",
           ".rb": "ruby", ".pl": "perl", ".pm": "perl", ".js": "node", ".mjs": "node", ".cjs": "node", ".ts": "node",
           ".php": "php", ".lua": "lua"}
_SHEBANG = re.compile(r"#!\s*(?:/usr/bin/env\s+(?:-S\s+)?)?\S*?(?P<name>bash|zsh|ksh|dash|sh|python\d*|ruby|perl|node|php)\b")
_MAX_TEXT = 262144
# npm lifecycle scripts that run on install, unasked: "postinstall": "..."
_LIFECYCLE = re.compile(r'"(?:pre|post)?(?:install|prepare|prepublish|preuninstall|postuninstall)"\s*:\s*"((?:\\.|[^"\\])*)"')
_AUTORUN = re.compile(r"(?:^|/)\.vscode/tasks\.json$|\.code-workspace$")
_FOLDER_OPEN = re.compile(r"[\"']runOn[\"']\s*:\s*[\"']folderOpen[\"']")
# How the shell model and the code scan say a shell is wired to a socket (commands.py, code.py)
_SOCKET_SHELL = ("reverse shell", "a shell on a socket", "a socket in the shell")


def language(path: str, text: str) -> str | None:
    """The language a written file is run in: by its #! line, else by its extension (None: not code)."""
    m = _SHEBANG.match(text.lstrip()[:200]) if text.lstrip().startswith("#!") else None
    if m:
        name = re.sub(r"\d+$", "", m.group("name"))
        return "sh" if name in ("bash", "zsh", "ksh", "dash", "sh") else name
    return _BY_EXT.get(posixpath.splitext(path)[1].lower())


def planted(path: str, text: str, where: Where, how: str) -> list[Effect]:
    """What of `text`, written to `path`, would refuse it on its own: remote code run, credentials sent."""
    if _AUTORUN.search(path) and _FOLDER_OPEN.search(text):  # an editor task that runs when the folder opens
        p = resolve(path, where)
        return [Effect("persist", display(p, where), classify(p, where), f"{how} writes a task run on folder open")]
    if path.endswith("package.json"):  # lifecycle scripts run by every `npm install` of the package
        return [e for cmd in _LIFECYCLE.findall(text) for e in _shell_planted(path, cmd.encode().decode("unicode_escape"),
                                                                             where, how, every_run_remote=True)]
    lang = language(path, text)
    if lang is None or not text.strip() or len(text) > _MAX_TEXT:
        return []
    if lang == "sh":
        return _shell_planted(path, text, where, how)
    return _kept(path, scan(lang, text, where, 1, _judge), where, how)


def _shell_planted(path: str, text: str, where: Where, how: str, every_run_remote: bool = False) -> list[Effect]:
    j = Judge(1)
    try:
        j.script(text, where.at(posixpath.dirname(resolve(path, where)) or where.cwd), how)
    except ShellParseError:
        return []  # a fragment (an Edit's new text) need not parse on its own
    return _kept(path, j.out, where, how, every_run_remote)


def _kept(path: str, found: list[Effect], where: Where, how: str, every_run_remote: bool = False) -> list[Effect]:
    """The effects a written file is refused for, named by the file that holds them."""
    shown = display(resolve(path, where), where)
    return [Effect(e.kind, e.target, e.cls, f"{how} writes {shown} holding {e.how}") for e in found
            if (e.kind == "run-remote" and (every_run_remote or any(m in e.how for m in _SOCKET_SHELL)))
            or (e.kind == "send" and e.cls == "credential")]


def patch_texts(body: str) -> list[tuple[str, str]]:
    """apply_patch: each added or updated file with the lines the patch adds to it."""
    out: list[tuple[str, str]] = []
    path, lines = "", []
    for line in body.splitlines():
        m = re.match(r"^\*\*\* (?:Add|Update) File: (.+?)\s*$", line)
        if m or line.startswith("*** "):
            if path and lines:
                out.append((path, "\n".join(lines)))
            path, lines = (m.group(1), []) if m else ("", [])
        elif path and line.startswith("+"):
            lines.append(line[1:])
    if path and lines:
        out.append((path, "\n".join(lines)))
    return out
