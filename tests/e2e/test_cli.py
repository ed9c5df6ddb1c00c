"""The CLI skeleton: every subcommand has --help; unlanded ones exit 2 with one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

SUBCOMMANDS = ["run", "agent", "serve", "guard", "q4kdiag", "chat"]


def fak(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "commands.main", *args], capture_output=True, text=True, timeout=120)


def test_version() -> None:
    r = fak("--version")
    assert r.returncode == 0
    assert r.stdout.strip().startswith("fak 0.")


@pytest.mark.parametrize("cmd", SUBCOMMANDS)
def test_help(cmd: str) -> None:
    r = fak(cmd, "--help")
    assert r.returncode == 0, r.stderr
    assert "Usage" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["run", "--max-tokens", "abc", "synthetic"], "fak run: Invalid value for '--max-tokens'"),
    (["run", "--bogus"], "fak run: No such option: --bogus"),
    (["audit", "verify"], "fak audit verify: Missing argument"),
])
def test_usage_errors_are_one_line(args: list[str], needle: str) -> None:
    r = fak(*args)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fak: error: ") and needle in lines[0], r.stderr


def test_no_arguments_prints_help() -> None:
    r = fak()
    assert r.returncode == 2 and "Usage" in r.stdout and "Traceback" not in r.stderr
