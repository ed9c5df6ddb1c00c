"""A tool call -> the effects it would have: the shell model for shell tools, the arguments themselves for
file and fetch tools. Which tool is which comes from the policy's `effects` table (Claude Code's, Codex's
and aider-style names by default), so a policy can teach fak a new agent's tools without code.
"""

from __future__ import annotations

import functools
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from fak.core.abi import ToolCall
from fak.core.shell import Effect, ShellParseError, Where, effects
from fak.core.shell.argv import METADATA_HOSTS, SECRET_PATTERN, _url_host
from fak.core.shell.patch import patch_effects
from fak.core.shell.patch import path_effects as _path_effects
from fak.core.shell.planted import patch_texts, planted
from fak.core.shell.targets import classify, display, resolve

_CACHE_MAX = 4096


@dataclass
class ToolModel:
    """Where each tool's effects are read from: {tool: dotted field}, per family."""

    shell: dict[str, str] = field(default_factory=dict)  # a command: text or an argv list
    read: dict[str, str] = field(default_factory=dict)  # a path read
    write: dict[str, str] = field(default_factory=dict)  # a path written
    search: dict[str, str] = field(default_factory=dict)  # a path searched (Grep, Glob): its pattern matters
    patch: dict[str, str] = field(default_factory=dict)  # an apply_patch body
    fetch: dict[str, str] = field(default_factory=dict)  # a URL fetched
    cwd_field: tuple[str, ...] = ("workdir", "cwd", "working_directory")
    _cache: OrderedDict[tuple[str, ...], tuple[Effect, ...]] = field(default_factory=OrderedDict, repr=False)

    def knows(self, tool: str) -> bool:
        return any(tool in t for t in (self.shell, self.read, self.write, self.search, self.patch, self.fetch))

    def where(self, call: ToolCall) -> Where:
        meta = call.meta
        args = call.args_obj if isinstance(call.args_obj, dict) else {}
        cwd = next((args[f] for f in self.cwd_field if isinstance(args.get(f), str) and args[f].startswith("/")), None)
        base = str(meta.get("cwd") or os.getcwd())
        home = str(meta.get("home") or os.environ.get("HOME") or os.path.expanduser("~"))
        return _where(cwd or base, home, str(meta.get("project") or base))

    def effects(self, call: ToolCall) -> tuple[Effect, ...]:
        """The call's effects. ShellParseError when a shell tool's command is not shell."""
        tool = call.tool
        args = call.args_obj if isinstance(call.args_obj, dict) else {}
        where: Where | None = None
        out: list[Effect] = []
        if tool in self.shell:
            cmd = _get(args, self.shell[tool])
            if cmd is None:
                return ()
            where = self.where(call)
            key = (tool, cmd if isinstance(cmd, str) else "\x00".join(map(str, cmd)), where.cwd, where.home)
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            if isinstance(cmd, list):
                cmd = [str(x) for x in cmd]
            elif not isinstance(cmd, str):
                cmd = str(cmd)
            got = tuple(dict.fromkeys(effects(cmd, where)))
            self._cache[key] = got
            if len(self._cache) > _CACHE_MAX:
                self._cache.popitem(last=False)
            return got
        fam_key = None
        text = ""  # what a write tool puts in its file
        if tool in self.write or tool in self.read or tool in self.search or tool in self.patch or tool in self.fetch:
            fields = [_get(args, t[tool]) for t in (self.write, self.read, self.search, self.patch, self.fetch) if tool in t]
            where = self.where(call)
            # the text a write puts in its file is part of the key: the same path with other content is judged anew
            text = _written_text(args) if tool in self.write else ""
            fam_key = (tool, repr(fields), repr(args.get("pattern")), repr(args.get("glob")), text, where.cwd, where.home)
            hit = self._cache.get(fam_key)
            if hit is not None:
                return hit
        if tool in self.write or tool in self.read or tool in self.search:
            where = where or self.where(call)  # set with the cache key above
            fam = "write" if tool in self.write else "read" if tool in self.read else "search"
            path = _get(args, (self.write if fam == "write" else self.read if fam == "read" else self.search)[tool])
            if isinstance(path, str) and path:
                out += _path_effects("write" if fam == "write" else "read", path, where, tool)
                if fam == "write":
                    out += planted(path, text, where, tool)
            if fam == "search":
                pat = args.get("pattern") or args.get("glob") or ""
                if isinstance(pat, str):
                    if "/" in pat or pat.startswith("~"):
                        rooted = pat.startswith(("/", "~")) or not isinstance(path, str) or not path
                        joined = pat if rooted else path.rstrip("/") + "/" + pat
                        out += _path_effects("read", joined, where, tool)
                    base = resolve(path, where) if isinstance(path, str) and path else where.cwd
                    if SECRET_PATTERN.search(pat) and classify(base, where) in ("home", "root", "system"):
                        out.append(Effect("read-secret", display(base, where), "credential",
                                          f"{tool} for secrets across {classify(base, where)}"))
        if tool in self.patch:
            body = _get(args, self.patch[tool])
            if isinstance(body, str):
                where = where or self.where(call)
                out += patch_effects(body, where, tool)
                for path, text in patch_texts(body):
                    out += planted(path, text, where, tool)
        if tool in self.fetch:
            url = _get(args, self.fetch[tool])
            if isinstance(url, str):
                host = _url_host(url)
                if host in METADATA_HOSTS or host.startswith("169.254."):
                    out.append(Effect("read-secret", host, "metadata", f"{tool} of the cloud metadata endpoint"))
                elif url.startswith("file://"):
                    out += _path_effects("read", url[7:], self.where(call), tool)
        got = tuple(dict.fromkeys(out))
        if fam_key is not None:
            self._cache[fam_key] = got
            if len(self._cache) > _CACHE_MAX:
                self._cache.popitem(last=False)
        return got


@functools.lru_cache(maxsize=256)
def _where(cwd: str, home: str, project: str) -> Where:
    return Where(cwd, home, project)  # calls come from a few places: one record each (Where is frozen)


def _written_text(args: dict[str, Any]) -> str:
    """The text a write tool puts in its file: Write's content, Edit's new string, MultiEdit's new strings."""
    parts = [args.get(k) for k in ("content", "new_string", "new_source")]
    edits = args.get("edits")
    if isinstance(edits, list):
        parts += [e.get("new_string") for e in edits if isinstance(e, dict)]
    return "\n".join(p for p in parts if isinstance(p, str))


def _get(obj: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


DEFAULT = {
    "shell": {"Bash": "command", "exec_command": "cmd", "shell": "command", "local_shell": "command",
              "container.exec": "command", "run_command": "command", "write_stdin": "chars", "Monitor": "command"},
    "read": {"Read": "file_path", "NotebookRead": "notebook_path", "read_file": "path", "view_image": "path",
             "LS": "path"},
    "write": {"Write": "file_path", "Edit": "file_path", "MultiEdit": "file_path", "NotebookEdit": "notebook_path",
              "write_file": "path", "edit_file": "path"},
    "search": {"Grep": "path", "Glob": "path"},
    "patch": {"apply_patch": "input"},
    "fetch": {"WebFetch": "url"},
}

__all__ = ["DEFAULT", "ShellParseError", "ToolModel", "patch_effects"]
