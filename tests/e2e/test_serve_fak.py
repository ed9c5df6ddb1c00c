"""fak's own routes on the gateway: /v1/fak/adjudicate (a dry run) and /v1/fak/syscall (adjudicated,
journaled, dispatched), on the app in process (no model needed), and the journal verifying."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fak.core.journal import Journal, verify
from fak.core.kernel import Kernel
from fak.core.policy import serving_floor
from fak.gateway import create_app
from fak.gateway.config import ServeConfig
from support import paths

REPO = paths.REPO


@pytest.fixture
def app_and_journal(tmp_path: Path):  # type: ignore[no-untyped-def]
    kernel = Kernel.with_policy(serving_floor())
    kernel.journal = Journal(tmp_path / "j.jsonl", fsync=False)
    yield TestClient(create_app(lambda: None, ServeConfig("m"), background=False, kernel=kernel)), kernel, tmp_path / "j.jsonl"
    kernel.journal.close()


def test_adjudicate_is_a_dry_run(app_and_journal) -> None:  # type: ignore[no-untyped-def]
    client, kernel, path = app_and_journal
    r = client.post("/v1/fak/adjudicate", json={"tool": "Bash", "arguments": {"command": "rm -rf ~"}}).json()
    assert r["verdict"]["kind"] == "DENY" and r["verdict"]["reason"] == "POLICY_BLOCK" and r["allowed"] is False
    ok = client.post("/v1/fak/adjudicate", json={"tool": "Bash", "arguments": '{"command": "ls -la"}'}).json()
    assert ok["verdict"]["kind"] == "ALLOW" and ok["arguments"] == {"command": "ls -la"} and ok["seq_no"] is None
    bad = client.post("/v1/fak/adjudicate", json={"tool": "Bash", "arguments": "{not json"}).json()
    assert bad["verdict"]["reason"] == "MALFORMED"
    assert kernel.stats()["submits"] == 0 and path.read_bytes() == b""  # nothing counted, nothing journaled


def test_syscall_adjudicates_journals_and_dispatches(app_and_journal) -> None:  # type: ignore[no-untyped-def]
    client, kernel, path = app_and_journal
    denied = client.post("/v1/fak/syscall", json={"tool": "Bash", "arguments": {"command": "sudo rm -rf /"}}).json()
    assert denied["allowed"] is False and denied["result"]["status"] == "ERROR" and denied["seq_no"] == 1
    ran = client.post("/v1/fak/syscall", json={"tool": "Read", "arguments": {"file_path": "README.md"}}).json()
    assert ran["allowed"] is True and ran["result"]["status"] == "OK" and ran["seq_no"] == 2
    assert kernel.stats()["submits"] == 2 and kernel.stats()["denies"] == 1 and kernel.stats()["engine_calls"] == 1
    rep = verify(path)
    assert rep.ok and rep.records == 2, rep
    r = subprocess.run([sys.executable, "-m", "commands.main", "audit", "verify", str(path)], capture_output=True,
                       text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    for body in ({"tool": ""}, {"tool": "Read", "arguments": 3}, {"tool": "Read", "bogus": 1}):
        assert client.post("/v1/fak/syscall", json=body).status_code == 400
