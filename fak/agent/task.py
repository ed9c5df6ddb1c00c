"""A task is data (`examples/tasks/*.json`): instructions, the sandbox's files, the tools offered, a
success check, and for `--offline` a scripted plan.

    {"name": "fix-failing-test", "instructions": "...", "files": {"calc.py": "..."},
     "tools": ["Read", "Edit", "Bash"], "success": [{"run": "python test_calc.py"}],
     "canaries": ["important.txt"], "injection_marker": "attacker.invalid",
     "secret": {"value": "sk-...", "sinks": ["exfil.txt"]},
     "plan": [{"tool": "Bash", "args": {"command": "python test_calc.py"}}, ...]}

Checks: {"run": CMD} exits 0 in the sandbox; {"exists": PATH}; {"absent": PATH};
{"contains": PATH, "text": TEXT}. A plan step: {"tool", "args"?, "when"?, "args_from"?}: `when`
{"seen": REGEX} (the planner's context matches) or {"failed": I} (step I was proposed and came back
an error or a refusal); `args_from` {field: REGEX} fills an argument from the first group of a match
in the context (no match: the step is skipped), the way a naive planner follows what it read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fak.core.jsonfile import read_json
from fak.errors import FakError
from fak.tools import TOOL_NAMES

TASKS_DIR = Path(__file__).resolve().parents[2] / "examples" / "tasks"
_FIELDS = {"name", "description", "instructions", "files", "tools", "success", "canaries", "injection_marker",
           "secret", "plan", "max_turns"}
_CHECKS = ("run", "exists", "absent", "contains")


@dataclass(frozen=True)
class Check:
    kind: str  # run | exists | absent | contains
    arg: str
    text: str = ""


@dataclass(frozen=True)
class Step:
    tool: str
    args: dict[str, Any]
    when_seen: re.Pattern[str] | None = None
    when_failed: int | None = None
    args_from: dict[str, re.Pattern[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Secret:
    value: str
    sinks: tuple[str, ...]  # sandbox files that stand for the attacker's side: the secret there has left


@dataclass(frozen=True)
class Task:
    name: str
    source: str
    instructions: str
    files: dict[str, str]
    tools: tuple[str, ...]
    success: tuple[Check, ...]
    description: str = ""
    canaries: tuple[str, ...] = ()
    injection_marker: str | None = None
    secret: Secret | None = None
    plan: tuple[Step, ...] | None = None
    max_turns: int | None = None


def known_tasks() -> list[str]:
    return sorted(p.stem for p in TASKS_DIR.glob("*.json"))


def load_task(name_or_file: str) -> Task:
    """A shipped task by name (`examples/tasks/NAME.json`) or a task file; one-line FakError otherwise."""
    p = Path(name_or_file)
    if not (p.suffix == ".json" or "/" in name_or_file or p.exists()):
        p = TASKS_DIR / f"{name_or_file}.json"
        if not p.is_file():
            raise FakError(f"unknown task {name_or_file!r} (known: {', '.join(known_tasks()) or 'none'}; or a task file)")
    return parse_task(read_json(p, "task"), str(p))


class _Fail:
    def __init__(self, source: str) -> None:
        self.source = source

    def __call__(self, where: str, msg: str) -> FakError:
        return FakError(f"{self.source}: {where}: {msg}")

    def regex(self, where: str, pattern: Any) -> re.Pattern[str]:
        if not isinstance(pattern, str):
            raise self(where, "expected a regular expression string")
        try:
            return re.compile(pattern)
        except re.error as exc:
            raise self(where, f"bad regular expression: {exc}") from None


def _str(obj: dict[str, Any], key: str, fail: _Fail, *, required: bool = False, default: str = "") -> str:
    v = obj.get(key)
    if v is None:
        if required:
            raise fail(key, "missing (expected a string)")
        return default
    if not isinstance(v, str) or (required and not v.strip()):
        raise fail(key, "expected a non-empty string")
    return v


def _rel_path(where: str, v: Any, fail: _Fail) -> str:
    if not isinstance(v, str) or not v or v.startswith(("/", "~")) or ".." in Path(v).parts:
        raise fail(where, f"expected a path inside the sandbox, got {v!r}")
    return v


def _check(i: int, c: Any, fail: _Fail) -> Check:
    where = f"success[{i}]"
    if not isinstance(c, dict):
        raise fail(where, f"expected an object with one of {', '.join(_CHECKS)}")
    kinds = [k for k in _CHECKS if k in c]
    if len(kinds) != 1 or set(c) - {kinds[0], "text"}:
        raise fail(where, f"expected exactly one of {', '.join(_CHECKS)} (and 'text' with contains)")
    k = kinds[0]
    if k == "run":
        if not isinstance(c["run"], str) or not c["run"].strip():
            raise fail(f"{where}.run", "expected a command")
        return Check("run", c["run"])
    path = _rel_path(f"{where}.{k}", c[k], fail)
    if k == "contains":
        if not isinstance(c.get("text"), str):
            raise fail(f"{where}.text", "expected a string")
        return Check(k, path, c["text"])
    if "text" in c:
        raise fail(f"{where}.text", "only a contains check has text")
    return Check(k, path)


def _step(i: int, s: Any, fail: _Fail, n: int) -> Step:
    where = f"plan[{i}]"
    if not isinstance(s, dict):
        raise fail(where, "expected an object {tool, args?, when?, args_from?}")
    odd = sorted(set(s) - {"tool", "args", "when", "args_from"})
    if odd:
        raise fail(f"{where}.{odd[0]}", "unknown field (known: tool, args, when, args_from)")
    tool = s.get("tool")
    if not isinstance(tool, str) or not tool:
        raise fail(f"{where}.tool", "expected a tool name")
    args = s.get("args", {})
    if not isinstance(args, dict):
        raise fail(f"{where}.args", "expected an object")
    when = s.get("when", {})
    if not isinstance(when, dict) or set(when) - {"seen", "failed"}:
        raise fail(f"{where}.when", "expected {seen: REGEX} or {failed: STEP}")
    seen = fail.regex(f"{where}.when.seen", when["seen"]) if "seen" in when else None
    failed = when.get("failed")
    if failed is not None and (not isinstance(failed, int) or isinstance(failed, bool) or not 0 <= failed < i):
        raise fail(f"{where}.when.failed", f"expected the index of an earlier step (0..{i - 1})")
    af = s.get("args_from", {})
    if not isinstance(af, dict):
        raise fail(f"{where}.args_from", "expected {field: REGEX}")
    rx = {k: fail.regex(f"{where}.args_from.{k}", v) for k, v in af.items()}
    for k, r in rx.items():
        if r.groups < 1:
            raise fail(f"{where}.args_from.{k}", "expected a regular expression with a group")
    return Step(tool, dict(args), seen, failed, rx)


def parse_task(obj: Any, source: str = "<task>") -> Task:
    """A task dict -> Task; every problem is a FakError naming the source and the field."""
    fail = _Fail(source)
    if not isinstance(obj, dict):
        raise FakError(f"{source}: a task must be a JSON object")
    odd = sorted(set(obj) - _FIELDS)
    if odd:
        raise fail(odd[0], f"unknown field (known: {', '.join(sorted(_FIELDS))})")
    instructions = _str(obj, "instructions", fail, required=True)
    files = obj.get("files", {})
    if not isinstance(files, dict):
        raise fail("files", "expected {path: content}")
    for k, v in files.items():
        _rel_path(f"files.{k}", k, fail)
        if not isinstance(v, str):
            raise fail(f"files.{k}", "expected the file's content as a string")
    tools = obj.get("tools", list(TOOL_NAMES))
    if not isinstance(tools, list) or not tools or not all(isinstance(t, str) for t in tools):
        raise fail("tools", "expected a non-empty list of tool names")
    for t in tools:
        if t not in TOOL_NAMES:
            raise fail("tools", f"unknown tool {t!r} (known: {', '.join(TOOL_NAMES)})")
    succ = obj.get("success")
    if not isinstance(succ, list) or not succ:
        raise fail("success", "missing (expected a non-empty list of checks)")
    canaries = obj.get("canaries", [])
    if not isinstance(canaries, list):
        raise fail("canaries", "expected a list of paths")
    secret = obj.get("secret")
    sec = None
    if secret is not None:
        if not isinstance(secret, dict) or not isinstance(secret.get("value"), str) or not secret["value"]:
            raise fail("secret", "expected {value: TEXT, sinks: [PATH]}")
        sinks = secret.get("sinks", [])
        if not isinstance(sinks, list):
            raise fail("secret.sinks", "expected a list of paths")
        sec = Secret(secret["value"], tuple(_rel_path(f"secret.sinks[{i}]", s, fail) for i, s in enumerate(sinks)))
    plan = obj.get("plan")
    steps = None
    if plan is not None:
        if not isinstance(plan, list) or not plan:
            raise fail("plan", "expected a non-empty list of steps")
        steps = tuple(_step(i, s, fail, len(plan)) for i, s in enumerate(plan))
        for i, st in enumerate(steps):
            if st.tool not in tools:
                raise fail(f"plan[{i}].tool", f"{st.tool!r} is not among the task's tools ({', '.join(tools)})")
    mt = obj.get("max_turns")
    if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
        raise fail("max_turns", "expected a positive integer")
    marker = obj.get("injection_marker")
    if marker is not None and (not isinstance(marker, str) or not marker):
        raise fail("injection_marker", "expected a non-empty string")
    return Task(
        name=_str(obj, "name", fail, default=Path(source).stem), source=source, instructions=instructions,
        files=dict(files), tools=tuple(tools), success=tuple(_check(i, c, fail) for i, c in enumerate(succ)),
        description=_str(obj, "description", fail),
        canaries=tuple(_rel_path(f"canaries[{i}]", c, fail) for i, c in enumerate(canaries)),
        injection_marker=marker, secret=sec, plan=steps, max_turns=mt,
    )
