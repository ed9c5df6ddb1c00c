"""Shape of the effects red-team corpus (tests/support/redteam/effects.jsonl; format in its README.md).

Only the corpus itself is checked here, not any policy: fields and vocabularies, unique ids, the size and the
benign share, the coverage of every kind by every agent family, and each tool's real argument shape. The
corpus is written from kinds of attack, not from the rules it judges, so nothing here imports the policy.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import pytest

from support import paths

CORPUS = paths.SUPPORT / "redteam" / "effects.jsonl"

KINDS = ("target-spelling", "interpreter", "codex-argv", "persistence", "credentials", "reverse-shell", "system",
         "wrappers", "obfuscation", "file-tools")
EFFECTS = ("delete", "write", "chmod", "read-secret", "send", "run-remote", "persist", "escalate", "kill", "teardown",
           "history", "tamper", "publish", "opaque", "none")
TARGETS = ("root", "system", "device", "home", "credential", "agent-state", "project", "project-git", "temp", "network",
           "process", "remote")
EXPECTS = ("deny", "witness", "allow")
AGENTS = ("claude", "codex", "aider")
TOOLS = {
    "claude": ("Bash", "Write", "Edit", "Read", "Grep", "Glob", "WebFetch"),
    "codex": ("exec_command", "shell", "apply_patch"),
    "aider": ("run_command", "write_file", "read_file"),
}
# Per tool: (required keys, optional keys). Every value is a string except shell's command (a list of strings),
# Bash's timeout (an int) and the booleans.
SHAPES: dict[str, tuple[set[str], set[str]]] = {
    "Bash": ({"command"}, {"description", "timeout", "run_in_background"}),
    "Write": ({"file_path", "content"}, set()),
    "Edit": ({"file_path", "old_string", "new_string"}, {"replace_all"}),
    "Read": ({"file_path"}, {"offset", "limit"}),
    "Grep": ({"pattern"}, {"path", "glob", "type", "output_mode", "-i", "-n"}),
    "Glob": ({"pattern"}, {"path"}),
    "WebFetch": ({"url", "prompt"}, set()),
    "exec_command": ({"cmd"}, {"workdir", "yield_time_ms", "max_output_tokens"}),
    "shell": ({"command"}, {"workdir", "timeout_ms"}),
    "apply_patch": ({"input"}, set()),
    "run_command": ({"command"}, set()),
    "write_file": ({"path", "content"}, set()),
    "read_file": ({"path"}, set()),
}
REQUIRED = {"id", "kind", "agent", "tool", "args", "expect", "effect", "target", "why"}
OPTIONAL = {"source"}
SOURCE = re.compile(r"^(codex-argv|(gtfobins|incident):[a-z0-9][a-z0-9.-]*)$")
PATCH_OP = re.compile(r"^\*\*\* (Add|Update|Delete) File: \S.*$", re.M)
# Kinds every agent family can express; codex-argv is Codex's own form.
ONLY = {"codex-argv": {"codex"}}


def load() -> list[dict[str, Any]]:
    return [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def corpus() -> list[dict[str, Any]]:
    return load()


def destructive(e: dict[str, Any]) -> bool:
    return e["expect"] != "allow"


def test_fields_and_vocabularies(corpus: list[dict[str, Any]]) -> None:
    for e in corpus:
        assert REQUIRED <= set(e) <= REQUIRED | OPTIONAL, (e.get("id"), set(e) ^ REQUIRED)
        assert e["kind"] in KINDS, e["id"]
        assert e["agent"] in AGENTS, e["id"]
        assert e["tool"] in TOOLS[e["agent"]], f"{e['id']}: {e['tool']} is not a {e['agent']} tool"
        assert e["expect"] in EXPECTS, e["id"]
        assert e["effect"] in EFFECTS, e["id"]
        assert e["target"] in TARGETS, e["id"]
        assert isinstance(e["why"], str) and e["why"].strip() and "\n" not in e["why"] and len(e["why"]) <= 120, e["id"]
        assert "source" not in e or SOURCE.match(e["source"]), (e["id"], e.get("source"))
        assert e["id"] == f"{e['kind']}-{e['id'].rsplit('-', 1)[-1]}" and re.fullmatch(r"\d{3}", e["id"][-3:]), e["id"]


def test_expect_agrees_with_effect(corpus: list[dict[str, Any]]) -> None:
    for e in corpus:
        if destructive(e):
            assert e["effect"] != "none", f"{e['id']}: a refused call must name the effect that decides it"
        if e["effect"] == "publish":
            assert e["expect"] == "witness", f"{e['id']}: publishing is confirmed by a human, not refused"
        if e["effect"] == "opaque":
            assert e["expect"] in ("witness", "deny"), f"{e['id']}: unjudgeable code with a sensitive target is not allowed"
    assert set(EFFECTS) == {e["effect"] for e in corpus}, set(EFFECTS) - {e["effect"] for e in corpus}
    assert set(TARGETS) == {e["target"] for e in corpus}, set(TARGETS) - {e["target"] for e in corpus}


def test_ids_unique(corpus: list[dict[str, Any]]) -> None:
    ids = Counter(e["id"] for e in corpus)
    assert not [i for i, n in ids.items() if n > 1]


def test_size_and_benign_share(corpus: list[dict[str, Any]]) -> None:
    assert len(corpus) >= 400, len(corpus)
    benign = sum(not destructive(e) for e in corpus)
    assert 0.40 <= benign / len(corpus) <= 0.60, (benign, len(corpus))


def test_every_kind_covered(corpus: list[dict[str, Any]]) -> None:
    by = Counter((e["kind"], destructive(e)) for e in corpus)
    for kind in KINDS:
        assert by[(kind, True)] >= 10, (kind, "destructive", by[(kind, True)])
        assert by[(kind, False)] >= 5, (kind, "benign", by[(kind, False)])


def test_every_agent_family_in_every_kind(corpus: list[dict[str, Any]]) -> None:
    for kind in KINDS:
        want = ONLY.get(kind, set(AGENTS))
        for side in (True, False):
            got = {e["agent"] for e in corpus if e["kind"] == kind and destructive(e) is side}
            assert got == want, (kind, "destructive" if side else "benign", got)
    argv = [e for e in corpus if e["kind"] == "codex-argv"]
    assert all(e["tool"] == "shell" for e in argv), "codex-argv cases are Codex shell calls with an argv list"


def test_every_tool_used(corpus: list[dict[str, Any]]) -> None:
    used = {e["tool"] for e in corpus}
    assert used == {t for ts in TOOLS.values() for t in ts}, {t for ts in TOOLS.values() for t in ts} - used
    shell = [e["args"]["command"] for e in corpus if e["tool"] == "shell"]
    assert any(c[0] == "bash" and c[1] == "-lc" for c in shell), "the bash -lc form"
    assert any(c[0] not in ("bash", "sh", "zsh") for c in shell), "the plain argv form"
    ops = {m for e in corpus if e["tool"] == "apply_patch" for m in PATCH_OP.findall(e["args"]["input"])}
    assert ops == {"Add", "Update", "Delete"}, ops


def test_no_duplicate_calls(corpus: list[dict[str, Any]]) -> None:
    calls = Counter((e["tool"], json.dumps(e["args"], sort_keys=True)) for e in corpus)
    dups = [k for k, n in calls.items() if n > 1]
    assert not dups, dups[:5]


def _shape_error(tool: str, args: Any) -> str | None:
    if not isinstance(args, dict):
        return "args is not an object"
    required, optional = SHAPES[tool]
    if not required <= set(args) <= required | optional:
        return f"keys {sorted(args)}; required {sorted(required)}, optional {sorted(optional)}"
    for k, v in args.items():
        if tool == "shell" and k == "command":
            if not (isinstance(v, list) and v and all(isinstance(x, str) and x for x in v)):
                return "shell command must be a non-empty list of non-empty strings"
        elif k in ("timeout", "timeout_ms", "offset", "limit", "yield_time_ms", "max_output_tokens"):
            if not isinstance(v, int) or isinstance(v, bool):
                return f"{k} must be an int"
        elif k in ("run_in_background", "replace_all", "-i", "-n"):
            if not isinstance(v, bool):
                return f"{k} must be a bool"
        elif not isinstance(v, str) or (k not in ("content", "old_string", "new_string") and not v):
            return f"{k} must be a non-empty string"
    if tool in ("Write", "Edit", "Read") and not args["file_path"].startswith("/"):
        return "Claude Code's file tools take absolute paths"
    if "workdir" in args and not args["workdir"].startswith("/"):
        return "workdir must be absolute"
    if tool == "Edit" and args["old_string"] == args["new_string"]:
        return "an Edit must change something"
    if tool == "WebFetch" and not re.match(r"^https?://", args["url"]):
        return "WebFetch url must be http(s)"
    if tool == "apply_patch":
        text = args["input"]
        if not (text.startswith("*** Begin Patch\n") and text.endswith("\n*** End Patch")):
            return "apply_patch input must be wrapped in *** Begin Patch / *** End Patch"
        if not PATCH_OP.search(text):
            return "apply_patch input needs an Add/Update/Delete File header"
        for block in re.split(r"^(?=\*\*\* (?:Add|Update|Delete) File: )", text, flags=re.M)[1:]:
            head, *body = block.split("\n")
            body = [ln for ln in body if ln != "*** End Patch"]
            if head.startswith("*** Add File: ") and not all(ln.startswith("+") for ln in body if ln):
                return "every line of an added file starts with +"
            if head.startswith("*** Update File: ") and not all(ln[:1] in ("@", " ", "-", "+") for ln in body if ln):
                return "update hunks hold @@, context, - and + lines"
            if head.startswith("*** Delete File: ") and any(body):
                return "a deleted file has no body"
    return None


def test_args_shapes(corpus: list[dict[str, Any]]) -> None:
    bad = [f"{e['id']} {e['tool']}: {err}" for e in corpus if (err := _shape_error(e["tool"], e["args"]))]
    assert not bad, "\n".join(bad)
