"""fak.core.shell.simple builds the commands of simple text without tree-sitter: it must give exactly the
effects the parser's walk gives, on every command of the red-team corpora that takes it, and hand
everything else to the parser."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fak.core.shell import Where
from fak.core.shell.commands import Judge
from fak.core.shell.parse import ShellParseError, parse
from fak.core.shell.simple import simple
from support import paths

WHERE = Where("/work/proj", "/home/dev")


def judged(walker: Any) -> list[Any] | str:
    j = Judge()
    try:
        j.walker(walker)
    except ShellParseError:
        return "unparseable"  # a nested sh -c the parser refuses: both ways must refuse it
    return j.out


def corpus_commands() -> list[str]:
    out = []
    for f in sorted((paths.SUPPORT / "redteam").glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            args = json.loads(line).get("args", {}) if line.strip() else {}
            for c in (args.get("command"), args.get("cmd")):
                if isinstance(c, str):
                    out.append(c)
                elif isinstance(c, list) and len(c) == 3 and c[1] in ("-c", "-lc"):
                    out.append(c[2])
    return out


OURS = [
    "cd src && pytest -q tests/test_app.py 2>&1 | tail -20", "a;", "a | b > out", "a > out | b", "a && b > out",
    "echo hi>out", "echo a2>out", "x 2>&1 >/dev/null | y", "cd && ls ~", "cd - && ls", "cd ~/x && rm -rf .",
    "ls ~ '~' \"~\" ~/a", "true ||false", "a|b|c", "cat < in.txt", "echo 'a b' \"c d\" e'f'\"g\"", "rm -rf *",
    "git log --format='%h %s' -5", "export HISTFILE=/dev/null", "unset HISTFILE", "grep -rn 'rm -rf /' src",
    "pytest -q # a comment", "rm -rf ~ # cleanup", "#only a comment; rm -rf ~", "git status --short # 3.1",
]


def test_simple_text_gives_the_parsers_effects() -> None:
    cmds = corpus_commands() + OURS
    taken = 0
    for c in cmds:
        fast = simple(c, WHERE)
        if fast is None:
            continue
        taken += 1
        assert judged(fast) == judged(parse(c, WHERE)), c
    assert taken > 1000, taken  # most of what agents send takes it


@pytest.mark.parametrize("text", [
    "", "  ", ";a", "a && ", "a |", "| a", "a && && b", "echo $HOME", "echo `id`", "echo \"$(id)\"", "a & b", "a &> f",
    "cat <<EOF\nx\nEOF", "echo 'open", "FOO=1 cmd", "while true; do x; done", "if a; then b; fi", "{ a; }", "(a)",
    "echo {a,b}", "echo a\\ b", "echo 'a #b'", "echo a#b", "a\nb", "[[ -f x ]] && y", "! a", "echo \"a$b\"", "echo hi >",
])
def test_anything_else_takes_the_parser(text: str) -> None:
    assert simple(text, WHERE) is None


def test_pipelines_and_cd_are_the_parsers() -> None:
    w = simple("cd src && make 2>&1 | tee build.log; ls", WHERE)
    assert w is not None
    cd, make, tee, ls = w.cmds
    assert make.where.cwd == "/work/proj/src" and ls.where.cwd == "/work/proj/src"
    assert make.stdout is tee and tee.stdin is make and make.pipeline == [make, tee] and ls.pipeline == []
    assert [(r.op, r.target) for r in make.redirects] == [(">&", ("1",))]
