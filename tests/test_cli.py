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
