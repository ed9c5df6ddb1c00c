"""`fak run --trace` and `fak audit verify`: the example trace, --json shape, journal, and bad input
(one line naming file and problem, exit 2, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fak.core.trace import build_kernel, load_trace, replay
from support import paths

ROOT = paths.REPO
TRACE = ROOT / "examples" / "trace.json"


def fak(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "commands.main", *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


EXPECTED = [  # the example trace, call by call: (tool, verdict, reason, status)
    ("Bash", "ALLOW", "NONE", "OK"),
    ("Read", "ALLOW", "NONE", "OK"),
    ("Bash", "DENY", "POLICY_BLOCK", "ERROR"),
    ("Write", "DENY", "SELF_MODIFY", "ERROR"),
    ("WebFetch", "TRANSFORM", "REDACTED", "OK"),
    ("WebFetch", "QUARANTINE", "PROMPT_INJECTION", "OK"),
    ("Bash", "ALLOW", "WITNESSED", "OK"),
    ("Bash", "DENY", "UNWITNESSED", "ERROR"),
    ("shell", "DENY", "POLICY_BLOCK", "ERROR"),
    ("apply_patch", "ALLOW", "NONE", "OK"),
    ("DeleteEverything", "DENY", "UNKNOWN_TOOL", "ERROR"),
]
SUMMARY = {"submits": 11, "engine_calls": 6, "denies": 5, "transforms": 1, "quarantines": 1, "result_denies": 0}


def test_replay_in_process() -> None:
    rep = replay(load_trace(TRACE), build_kernel())
    assert [(r.tool, r.verdict, r.reason, r.status) for r in rep.rows] == EXPECTED
    assert rep.summary == SUMMARY


@pytest.mark.slow
def test_run_trace_json_and_journal(tmp_path: Path) -> None:
    j = tmp_path / "j.jsonl"
    r = fak("run", "--trace", str(TRACE), "--json", "--journal", str(j))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"calls", "summary"}
    assert [(c["tool"], c["verdict"], c["reason"], c["status"]) for c in out["calls"]] == EXPECTED
    assert all(set(c) == {"tool", "verdict", "reason", "by", "status"} for c in out["calls"])
    assert out["summary"] == SUMMARY
    # 11 submit records + 1 result record (the quarantine); the chain verifies, a flipped byte does not
    assert len(j.read_bytes().splitlines()) == 12
    v = fak("audit", "verify", str(j))
    assert v.returncode == 0 and "OK, 12 records" in v.stdout
    data = bytearray(j.read_bytes())
    data[data.index(b'"tool":"Write"') + 9] ^= 0x01  # inside line 4
    j.write_bytes(bytes(data))
    v = fak("audit", "verify", str(j))
    assert v.returncode == 1 and "BROKEN at line 4" in v.stdout


def test_run_trace_table() -> None:
    r = fak("run", "--trace", str(TRACE), "--policy", str(ROOT / "examples" / "coding-floor.policy.json"))
    assert r.returncode == 0, r.stderr
    for word in ("QUARANTINE", "TRANSFORM", "SELF_MODIFY", "UNKNOWN_TOOL", "policy:coding-floor", "submits=11", "quarantines=1"):
        assert word in r.stdout


def test_trace_args_raw_and_engine_field() -> None:
    from fak.core.trace import parse_trace

    tr = parse_trace({"calls": [{"tool": "Bash", "args_raw": "{oops"},
                                {"tool": "Bash", "args": {"command": "ls"}, "engine": "nope"}]})
    rep = replay(tr, build_kernel())
    assert [(r.verdict, r.reason, r.status) for r in rep.rows] == [("DENY", "MALFORMED", "ERROR"), ("ALLOW", "NONE", "ERROR")]


BAD_TRACES = [
    ('{"calls": [{"tool": "x", "args": [1]}]}', "calls[0].args: expected an object"),
    ('{"calls": [{"args": {}}]}', "calls[0].tool: expected a non-empty string"),
    ('{"steps": []}', "'calls' list"),
    ("{not json", "trace is not valid JSON"),
    ('{"calls": [{"tool": "x"}, {"tool": "y", "engine": "warp"}]}', "calls[1].engine: unknown engine 'warp'"),
    ('{"calls": [{"tool": "Bash", "args": {"command": "ls \\udcff"}}]}', "calls[0]: text is not valid Unicode"),
]


@pytest.mark.parametrize("text,needle", BAD_TRACES)
def test_bad_trace_in_process(tmp_path: Path, text: str, needle: str) -> None:
    from fak.errors import FakError

    p = tmp_path / "t.json"
    p.write_text(text)
    with pytest.raises(FakError) as ei:
        load_trace(p)
    assert str(p) in str(ei.value) and needle in str(ei.value)


def _one_line_error(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fak: error: "), r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    for n in needles:
        assert n in lines[0]


@pytest.mark.slow
def test_cli_bad_inputs(tmp_path: Path) -> None:
    bad_trace = tmp_path / "bad-trace.json"
    bad_trace.write_text('{"calls": [{"tool": "x", "args": "nope"}]}')
    _one_line_error(fak("run", "--trace", str(bad_trace)), str(bad_trace), "calls[0].args")
    bad_policy = tmp_path / "bad-policy.json"
    bad_policy.write_text('{"version": "fak-policy/v1", "deny": "Bash"}')
    _one_line_error(fak("run", "--trace", str(TRACE), "--policy", str(bad_policy)), str(bad_policy), "'deny'")
    _one_line_error(fak("run", "--trace", str(TRACE), "--engine", "warp"), "unknown engine 'warp'", "mock")
    _one_line_error(fak("run", "--trace", str(tmp_path / "missing.json")), "missing.json", "no such trace file")
    bad_engine = tmp_path / "bad-engine.json"
    bad_engine.write_text('{"calls": [{"tool": "Bash", "args": {"command": "ls"}, "engine": "warp"}]}')
    _one_line_error(fak("run", "--trace", str(bad_engine)), str(bad_engine), "calls[0].engine", "unknown engine 'warp'")
    _one_line_error(fak("run", "--trace", str(TRACE), "--policy", str(tmp_path)), str(tmp_path), "is a directory")
    _one_line_error(fak("audit", "verify", str(tmp_path / "missing.jsonl")), "missing.jsonl", "no such journal file")


def test_gguf_preloads_the_engine(capsys: pytest.CaptureFixture[str]) -> None:
    from commands.run_trace import run_trace
    from fak.engines import register_engine
    from fak.engines.mock import MockEngine

    seen: dict[str, object] = {}

    class Preloading(MockEngine):
        def __init__(self, gguf: str | None = None, resident: bool = False, **kw: object) -> None:
            super().__init__()
            seen.update(gguf=gguf, resident=resident)

        def preload(self) -> None:
            seen["preloaded"] = True

    register_engine("preloading-test", Preloading)
    run_trace(TRACE, engine="preloading-test", gguf="model.gguf", resident=True, as_json=True)
    # --gguf and resident are inkernel options (not passed to other engines), but any engine with preload() is preloaded
    assert seen == {"gguf": None, "resident": False, "preloaded": True}
    assert json.loads(capsys.readouterr().out)["summary"]["submits"] == 11
