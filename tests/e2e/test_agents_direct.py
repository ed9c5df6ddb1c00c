"""The real agents against the fake upstream directly (no guard): each runs the one
harmless shell call the fake model proposes and sends its result back. This pins what
fak guard relies on: the routes, the tool shapes and the tool-result follow-up of the
installed CLIs, and that the env in tests/agents/run.py keeps them off the network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agents.run import (
    RefusingProxy,
    bin_path,
    claude_argv,
    claude_env,
    codex_argv,
    codex_env,
    run_agent,
)

from support.fake_upstream import FakeUpstream, first_turn

pytestmark = [pytest.mark.slow, pytest.mark.agents]

HARMLESS = "echo ran > allowed.txt"
TIMEOUT = 120


def need(name: str) -> Path:
    exe = bin_path(name)
    if exe is None:
        pytest.skip(f"{name} is not installed in tests/agents/node_modules (npm ci --prefix tests/agents)")
    return exe


def dirs(tmp_path: Path) -> tuple[Path, Path]:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    return home, work


def test_claude_code_runs_the_proposed_bash_call(tmp_path: Path) -> None:
    need("claude")
    home, work = dirs(tmp_path)
    with FakeUpstream(first_turn(HARMLESS)) as up, RefusingProxy() as proxy:
        run = run_agent(claude_argv("Create allowed.txt"), claude_env(home, up.url, **proxy.env()), work, TIMEOUT)
    assert not run.timed_out, f"claude did not finish in {TIMEOUT} s: {run.stderr[-2000:]}"
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout)["is_error"] is False
    assert (work / "allowed.txt").read_text() == "ran\n"
    assert proxy.asked == []  # no telemetry, update check or anything else off 127.0.0.1

    # every request is a streamed Messages call on the beta route
    assert {(r.method, r.path, r.query) for r in up.requests} == {("POST", "/v1/messages", "beta=true")}
    assert all(r.body.get("stream") is True for r in up.requests)
    first, *rest = up.calls()
    assert first.offer and not first.offer.followup and "Bash" in first.offer.tools
    bash = next(t for t in first.body["tools"] if t["name"] == "Bash")
    assert bash["input_schema"]["required"] == ["command"]
    # the follow-up carries the tool_result for the call the fake model made
    follow = up.followups()
    assert follow and rest and follow[0] is rest[0]
    messages = follow[0].body["messages"]
    [use] = [b for m in messages if m["role"] == "assistant" for b in m["content"] if b.get("type") == "tool_use"]
    assert (use["name"], use["input"]) == ("Bash", {"command": HARMLESS})
    [result] = [b for m in messages if m["role"] == "user" and isinstance(m["content"], list)
                for b in m["content"] if b.get("type") == "tool_result"]
    assert result["tool_use_id"] == use["id"] and result["is_error"] is False


def test_codex_runs_the_proposed_exec_command(tmp_path: Path) -> None:
    need("codex")
    home, work = dirs(tmp_path)
    with FakeUpstream(first_turn(HARMLESS)) as up, RefusingProxy() as proxy:
        argv = codex_argv("Create allowed.txt", up.url + "/v1", "FAK_API_KEY")
        run = run_agent(argv, codex_env(home, "FAK_API_KEY", **proxy.env()), work, TIMEOUT)
    assert not run.timed_out, f"codex did not finish in {TIMEOUT} s: {run.stderr[-2000:]}"
    assert run.returncode == 0, run.stderr[-2000:]
    assert (work / "allowed.txt").read_text() == "ran\n"
    assert proxy.asked == []

    assert {(r.method, r.path) for r in up.requests} == {("POST", "/v1/responses")}
    assert all(r.headers["authorization"] == "Bearer sk-fak-dummy" for r in up.requests)
    first, *rest = up.calls()
    assert first.offer and not first.offer.followup and first.body["stream"] is True
    assert first.offer.tools[:1] == ["exec_command"] and first.offer.kind("apply_patch") == "custom"
    assert first.offer.schema("exec_command")["required"] == ["cmd"]  # type: ignore[index]
    follow = up.followups()
    assert follow and rest and follow[0] is rest[0]
    items = follow[0].body["input"]
    [call] = [i for i in items if i.get("type") == "function_call"]
    assert (call["name"], json.loads(call["arguments"])) == ("exec_command", {"cmd": HARMLESS})
    [output] = [i for i in items if i.get("type") == "function_call_output"]
    assert output["call_id"] == call["call_id"] and "exited with code 0" in output["output"]
