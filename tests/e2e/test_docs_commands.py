"""The commands in README.md and docs/ are real: every `fak ...` line in a fenced block names a subcommand and
flags the CLI has, and the blocks marked `<!-- runnable -->` (the cheap ones) run and exit 0.

A command line is taken from a fenced block's lines that start with `fak ` or `$ fak ` (or that pipe into
`fak`), continuation backslashes joined, cut at the first shell operator (`|`, `&&`, `;`, `&`, `>`, `#`).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer.main

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = "<!-- runnable -->"
OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "2>", "2>&1", "<"}


@dataclass(frozen=True)
class DocCommand:
    where: str  # file:line, for the failure message
    argv: tuple[str, ...]  # after `fak`
    runnable: bool


def _blocks(path: Path) -> list[tuple[int, list[str], bool]]:
    """(first line number, command lines, marked runnable) of each fenced block: in a bash/sh block every
    line, in a console or plain one the `$ ` lines (the rest is output), in any other language none."""
    out, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            marked = i > 0 and lines[i - 1].strip() == RUNNABLE
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            lang = lines[i][3:].strip().split(" ")[0]
            body = lines[i + 1:j]
            if lang in ("", "console", "text"):
                body = [ln if ln.startswith("$ ") or (k and body[k - 1].endswith("\\")) else "" for k, ln in enumerate(body)]
            elif lang not in ("bash", "sh", "shell"):
                body = []
            out.append((i + 2, body, marked))
            i = j
        i += 1
    return out


def _argv(line: str) -> list[str] | None:
    """The `fak` argv of one shell line (None if the line runs no fak)."""
    line = line.strip()
    if line.startswith("$ "):
        line = line[2:]
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    if "fak" not in words:
        return None
    start = words.index("fak")
    if start and words[start - 1] not in ("|", "&&", ";"):
        return None  # `fak` as an argument (a path, a word in prose), not the command
    argv = []
    for w in words[start + 1:]:
        if w in OPERATORS or w.startswith((">", "2>")):
            break
        argv.append(w)
    return argv


def doc_commands() -> list[DocCommand]:
    found = []
    for path in DOCS:
        for first, lines, marked in _blocks(path):
            joined: list[tuple[int, str]] = []
            for k, ln in enumerate(lines):
                if joined and joined[-1][1].endswith("\\"):
                    joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + ln.strip())
                else:
                    joined.append((first + k, ln))
            for lineno, ln in joined:
                stripped = ln.strip()
                if not re.match(r"^(\$ )?(fak |\w.*\| *fak )", stripped):
                    continue
                argv = _argv(stripped)
                if argv is not None:
                    found.append(DocCommand(f"{path.relative_to(ROOT)}:{lineno}", tuple(argv), marked))
    return found


def _cli() -> typer.main.click.Group:  # type: ignore[name-defined]
    from commands import main

    main._register()
    return typer.main.get_command(main.app)


def _check(cli, cmd: DocCommand) -> str | None:  # type: ignore[no-untyped-def]
    """Why this command line would not parse (None when it would)."""
    group, args = cli, list(cmd.argv)
    while hasattr(group, "commands") and args and not args[0].startswith("-"):
        name = args.pop(0)
        if name not in group.commands:
            return f"no subcommand {name!r} (have {sorted(group.commands)})"
        group = group.commands[name]
    if hasattr(group, "commands"):
        return "names no subcommand"
    known = {o for p in group.params for o in (*p.opts, *p.secondary_opts)}
    for a in args:
        if a == "--":
            break  # the agent's own argv (fak guard ... -- claude ...)
        flag = a.split("=", 1)[0]
        if flag.startswith("--") and flag not in known:
            return f"unknown flag {flag!r} for `fak {' '.join(cmd.argv[:1])}`"
    return None


COMMANDS = doc_commands()


def test_docs_have_commands_and_runnable_ones() -> None:
    # the extraction must find the README's tour and the marked blocks, or every check below is empty
    assert len(COMMANDS) >= 40, len(COMMANDS)
    subs = {c.argv[0] for c in COMMANDS if c.argv}
    assert {"run", "chat", "serve", "guard", "agent", "q4kdiag", "top", "doctor", "worker", "audit"} <= subs, subs
    assert sum(c.runnable for c in COMMANDS) >= 5


def test_every_documented_command_parses() -> None:
    cli = _cli()
    bad = [f"{c.where}: fak {' '.join(c.argv)}: {why}" for c in COMMANDS if (why := _check(cli, c))]
    assert not bad, "\n".join(bad)


def test_the_check_catches_a_wrong_flag_and_subcommand() -> None:
    cli = _cli()
    assert _check(cli, DocCommand("x", ("serve", "--gguf", "m", "--no-such-flag"), False))
    assert _check(cli, DocCommand("x", ("srve",), False))
    assert _check(cli, DocCommand("x", ("audit",), False))
    assert _check(cli, DocCommand("x", ("audit", "verify", "j.jsonl"), False)) is None
    assert _check(cli, DocCommand("x", ("guard", "--", "claude", "--allowedTools", "Bash"), False)) is None


def test_relative_links_resolve() -> None:
    # a page moved or a chart not regenerated leaves a dead link a newcomer meets first
    bad = []
    for path in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if not re.match(r"^[a-z]+:", target) and not (path.parent / target).exists():
                bad.append(f"{path.relative_to(ROOT)}: {target}")
    assert not bad, bad


RUN = [c for c in COMMANDS if c.runnable]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # one directory for all, so a block's later line reads what an earlier one wrote (a journal, a report);
    # examples/ is there as it is in the repository, which the commands name
    d = tmp_path_factory.mktemp("docs")
    (d / "examples").symlink_to(ROOT / "examples")
    return d


@pytest.mark.parametrize("cmd", RUN, ids=[f"{c.where}" for c in RUN])
@pytest.mark.slow
def test_runnable_command_exits_0(cmd: DocCommand, workdir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    r = subprocess.run([sys.executable, "-m", "commands.main", *cmd.argv], cwd=workdir, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{cmd.where}: fak {' '.join(cmd.argv)} exited {r.returncode}\n{r.stderr[-2000:]}"
    assert r.stdout.strip() or r.stderr.strip(), f"{cmd.where}: printed nothing"
