"""The kernel in the serving loop (fak/gateway/toolgate.py): what a parsed call becomes for each
verdict, fed through a real parser in pieces, journaled."""

from __future__ import annotations

import json
from pathlib import Path

from fak.core.journal import Journal, verify
from fak.core.kernel import Kernel
from fak.core.policy import parse_policy
from fak.gateway.tool_parsers import HermesParser
from fak.gateway.toolgate import EmittedCall, ToolGate

POLICY = {
    "version": "fak-policy/v1", "name": "gate", "allow": ["Bash", "Fetch", "Deploy", "get_weather"],
    "arg_rules": [{"id": "no-rm", "tools": ["Bash"], "field": "command", "pattern": r"\brm\b", "detail": "no rm"}],
    "require_witness": [{"id": "deploy", "tools": ["Deploy"], "detail": "deploys need a witness"}],
    "transforms": [{"id": "token", "tools": ["Fetch"], "field": "url", "pattern": "token=[^&]+",
                    "replace": "token=X"}],
}
OFFERED = frozenset({"Bash", "Fetch", "Deploy", "get_weather"})


def _run(text: str, kernel: Kernel, offered: frozenset[str] = OFFERED) -> tuple[list[str | EmittedCall], ToolGate]:
    gate = ToolGate(HermesParser(), kernel, offered, trace_id="t")
    out: list[str | EmittedCall] = []
    for i in range(0, len(text), 3):  # fed in small pieces, as a stream arrives
        out += gate.feed(text[i:i + 3])
    return out + gate.close(), gate


def _call(name: str, args: dict[str, object]) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def test_each_verdict_becomes_what_the_client_sees(tmp_path: Path) -> None:
    kernel = Kernel.with_policy(parse_policy(POLICY))
    kernel.journal = Journal(tmp_path / "j.jsonl", fsync=False)
    text = ("Sure. " + _call("get_weather", {"city": "Paris"}) + _call("Bash", {"command": "rm -rf build"})
            + _call("Fetch", {"url": "https://x.test/?token=s3cret&a=1"}) + _call("Deploy", {"env": "prod"})
            + _call("Launch", {}) + "<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \n</tool_call>")
    out, gate = _run(text, kernel)
    calls = [o for o in out if isinstance(o, EmittedCall)]
    notes = "".join(o for o in out if isinstance(o, str))
    assert [(c.name, c.input) for c in calls] == [("get_weather", {"city": "Paris"}),
                                                  ("Fetch", {"url": "https://x.test/?token=X&a=1"})]  # TRANSFORM
    assert notes.startswith("Sure. ")
    for want in ("[fak] refused Bash: POLICY_BLOCK (no rm)", "[fak] refused Deploy: UNWITNESSED",
                 "[fak] refused Launch: UNKNOWN_TOOL", "[fak] refused Bash: MALFORMED"):
        assert want in notes, (want, notes)
    got = [(a.tool, a.verdict, a.reason, a.emitted) for a in gate.adjudications]
    assert got == [("get_weather", "ALLOW", "NONE", True), ("Bash", "DENY", "POLICY_BLOCK", False),
                   ("Fetch", "TRANSFORM", "REDACTED", True), ("Deploy", "DENY", "UNWITNESSED", False),
                   ("Launch", "DENY", "UNKNOWN_TOOL", False), ("Bash", "DENY", "MALFORMED", False)]
    assert gate.calls == calls and len({c.id for c in calls}) == 2
    kernel.journal.close()
    records = [json.loads(line) for line in (tmp_path / "j.jsonl").read_text().splitlines()]
    assert [(r["tool"], r["verdict"]) for r in records] == [(t, v) for t, v, _, _ in got]  # all six, in order
    assert verify(tmp_path / "j.jsonl").ok
