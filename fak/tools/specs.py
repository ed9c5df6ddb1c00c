"""The six tools as OpenAI-style function definitions (what a model is offered), in Claude Code's
argument shapes."""

from __future__ import annotations

import copy
from typing import Any


def _fn(name: str, description: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": props, "required": required, "additionalProperties": False}}}


_S = {"type": "string"}
TOOL_SPECS: list[dict[str, Any]] = [
    _fn("Read", "Read a text file of the working directory; lines are numbered (cat -n).",
        {"file_path": {**_S, "description": "path of the file, relative to the working directory"},
         "offset": {"type": "integer", "description": "first line to read (1-based)"},
         "limit": {"type": "integer", "description": "how many lines to read"}}, ["file_path"]),
    _fn("Glob", "List files matching a glob pattern such as **/*.py.",
        {"pattern": {**_S, "description": "the glob pattern"},
         "path": {**_S, "description": "directory to search in (default: the working directory)"}}, ["pattern"]),
    _fn("Grep", "Search file contents for a regular expression; prints path:line:text.",
        {"pattern": {**_S, "description": "the regular expression"},
         "path": {**_S, "description": "file or directory to search (default: the working directory)"},
         "glob": {**_S, "description": "only files whose name matches this glob, e.g. *.py"}}, ["pattern"]),
    _fn("Write", "Create or overwrite a file with the given content.",
        {"file_path": {**_S, "description": "path of the file"}, "content": {**_S, "description": "the whole new content"}},
        ["file_path", "content"]),
    _fn("Edit", "Replace an exact string in a file (it must occur once unless replace_all is true).",
        {"file_path": {**_S, "description": "path of the file"}, "old_string": {**_S, "description": "text to replace"},
         "new_string": {**_S, "description": "replacement text"},
         "replace_all": {"type": "boolean", "description": "replace every occurrence"}},
        ["file_path", "old_string", "new_string"]),
    _fn("Bash", "Run a shell command in the working directory and return its output.",
        {"command": {**_S, "description": "the command"},
         "timeout": {"type": "number", "description": "milliseconds before the command is killed"}}, ["command"]),
]
TOOL_NAMES: tuple[str, ...] = tuple(s["function"]["name"] for s in TOOL_SPECS)


def specs_for(names: list[str] | tuple[str, ...]) -> list[dict[str, Any]]:
    """The definitions of the named tools (in TOOL_SPECS order), deep copies the caller may change."""
    want = set(names)
    return [copy.deepcopy(s) for s in TOOL_SPECS if s["function"]["name"] in want]
