"""`fak guard -- AGENT` as a user runs it: the stand-in SDK agents (tests/support/standins/agent.py) under the
guard against the scripted fake upstream, in a sandbox with a canary in its HOME: the allowed command
runs, the destructive one never does, the journal records both and verifies. And the process
contract: the agent's exit code, signals forwarded, the base URL in the child's environment only,
bad usage one line and exit 2."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import paths
from support.fake_upstream import FakeUpstream, allowed_and_destructive

STANDIN = str(paths.SUPPORT / "standins" / "agent.py")
PROVIDER = {"anthropic": "anthropic", "chat": "openai", "responses": "responses"}


def sandbox(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    sb = tmp_path / "work"
    home = tmp_path / "home"
    sb.mkdir()
    home.mkdir()
    (home / "canary").write_text("alive\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_"))}
    env.update(HOME=str(home), FAK_STANDIN_SANDBOX=str(sb), ANTHROPIC_API_KEY="sk-ant-test", OPENAI_API_KEY="sk-test")
    return sb, env


def guard(*args: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "commands.main", "guard", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("wire,stream", [("anthropic", True), ("anthropic", False), ("chat", True), ("responses", True)])
@pytest.mark.slow
def test_standin_agent_under_guard(tmp_path: Path, wire: str, stream: bool) -> None:
    sb, env = sandbox(tmp_path)
    journal = tmp_path / "guard.jsonl"
    with FakeUpstream(allowed_and_destructive("echo ran > allowed.txt", "rm -rf ~")) as up:
        r = guard("--upstream", up.url, "--provider", PROVIDER[wire], "--journal", str(journal), "--json", "--",
                  sys.executable, STANDIN, "--wire", wire, *([] if stream else ["--no-stream"]), "fix the build",
                  cwd=sb, env=env)
        followups = up.followups()
    assert r.returncode == 0, r.stderr
    assert (sb / "allowed.txt").read_text() == "ran\n"  # the allowed call ran
    assert (tmp_path / "home" / "canary").exists()  # the destructive one never did
    assert "$ echo ran > allowed.txt" in r.stdout and "$ rm" not in r.stdout
    assert "[fak] refused" in r.stdout  # the agent showed its user the note
    # the model saw the note and the allowed command's result next turn
    assert len(followups) == 1 and "[fak] refused" in json.dumps(followups[0].body)
    rec = [json.loads(x) for x in journal.read_text().splitlines()]
    assert [(x["verdict"], x["reason"]) for x in rec] == [("ALLOW", "NONE"), ("DENY", "POLICY_BLOCK")]
    assert all(len(x["args_sha256"]) == 64 and x["trace_id"].startswith("guard-") for x in rec)
    v = subprocess.run([sys.executable, "-m", "commands.main", "audit", "verify", str(journal)], capture_output=True, text=True)
    assert v.returncode == 0 and "OK, 2 records" in v.stdout
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("fak guard: python · ") and f"→ {up.url}" in lines[0]  # the banner
    summary = json.loads(lines[-1])
    assert (summary["decisions"], summary["allowed"], summary["denied"], summary["exit_code"]) == (2, 1, 1, 0)
    assert summary["top_reasons"] == {"POLICY_BLOCK": 1} and summary["verify"] == f"fak audit verify {journal}"


@pytest.mark.slow
def test_exit_code_is_the_agents_and_the_default_journal(tmp_path: Path) -> None:
    sb, env = sandbox(tmp_path)
    with FakeUpstream() as up:
        r = guard("--upstream", up.url, "--", sys.executable, STANDIN, "--wire", "anthropic", "--exit-code", "3", "hi",
                  cwd=sb, env=env)
    assert r.returncode == 3, r.stderr
    assert "exited 3" in r.stderr and "decisions" in r.stderr  # the rich summary table
    made = list((sb / ".fak" / "guard").glob("*.jsonl"))
    assert len(made) == 1 and made[0].name.endswith(f"-{made[0].stem.rsplit('-', 1)[1]}.jsonl")
    assert f"journal .fak/guard/{made[0].name}" in r.stderr


AGENT_WAITS = """
import json, os, signal, sys, time
got = []
signal.signal(signal.SIGINT, lambda s, f: got.append("INT"))
open("ready", "w").write(json.dumps({k: v for k, v in os.environ.items() if "URL" in k or k.endswith("API_KEY")}))
deadline = time.time() + 30
while not got and time.time() < deadline:
    time.sleep(0.05)
time.sleep(0.5)  # a second copy of the signal would arrive by now
open("got", "w").write(",".join(got))
sys.exit(7)
"""


@pytest.mark.slow
def test_sigint_reaches_the_agent_and_the_summary_still_prints(tmp_path: Path) -> None:
    sb, env = sandbox(tmp_path)
    (sb / "agent.py").write_text(AGENT_WAITS)
    with FakeUpstream() as up:
        p = subprocess.Popen([sys.executable, "-m", "commands.main", "guard", "--upstream", up.url, "--no-journal",
                              "--env", "MY_AGENT_URL", "--", sys.executable, "agent.py"],
                             cwd=sb, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 60
            while not (sb / "ready").exists() and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(0.2)
            os.kill(p.pid, signal.SIGINT)  # as `kill -INT`: sent by a process, not the terminal
            out, err = p.communicate(timeout=60)
        finally:
            p.kill()
    assert p.returncode == 7, err
    assert (sb / "got").read_text() == "INT"  # exactly once
    assert "exited 7" in err and "Traceback" not in err
    seen = json.loads((sb / "ready").read_text())
    # the child had the gateway's URL; the guard set it in the child's environment only
    assert seen["ANTHROPIC_BASE_URL"].startswith("http://127.0.0.1:") and seen["MY_AGENT_URL"] == seen["ANTHROPIC_BASE_URL"]
    assert "ANTHROPIC_BASE_URL" not in os.environ and "MY_AGENT_URL" not in env


@pytest.mark.slow
def test_ctrl_c_at_the_terminal_reaches_the_agent_once(tmp_path: Path) -> None:
    """Ctrl-C in a terminal signals the whole foreground group (fak and the agent): fak must not send
    the agent a second SIGINT (Claude Code exits on the second one)."""
    import fcntl
    import pty
    import termios

    sb, env = sandbox(tmp_path)
    (sb / "agent.py").write_text(AGENT_WAITS)
    master, slave = pty.openpty()

    def controlling_tty() -> None:  # a new session whose controlling terminal is the pty
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    with FakeUpstream() as up:
        p = subprocess.Popen([sys.executable, "-m", "commands.main", "guard", "--upstream", up.url, "--no-journal",
                              "--", sys.executable, "agent.py"], cwd=sb, env=env, stdin=slave, stdout=slave,
                             stderr=slave, preexec_fn=controlling_tty)
        os.close(slave)
        try:
            deadline = time.time() + 60
            while not (sb / "ready").exists() and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(0.2)
            os.write(master, b"\x03")  # the terminal's interrupt character
            p.wait(timeout=60)
        finally:
            p.kill()
            out = b""
            while True:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
            os.close(master)
    assert p.returncode == 7, out.decode(errors="replace")
    assert (sb / "got").read_text() == "INT"
    assert b"exited 7" in out


def test_launch_sets_the_childs_environment_only() -> None:
    from fak.guard.agents import launch

    parent = {"PATH": "/bin", "OPENAI_API_KEY": "sk-mine"}
    before = dict(parent), dict(os.environ)
    la = launch(["codex", "exec", "fix it"], "responses", "http://127.0.0.1:5", parent)
    assert (dict(parent), dict(os.environ)) == before
    assert la.env["OPENAI_BASE_URL"] == "http://127.0.0.1:5/v1" and la.env["OPENAI_API_KEY"] == "sk-mine"
    assert la.argv[0] == "codex" and la.argv[-2:] == ["exec", "fix it"]
    flags = dict(a.split("=", 1) for a in la.argv[2:-2:2])
    assert flags == {"model_provider": "fak_guard", "model_providers.fak_guard.name": '"fak guard"',
                     "model_providers.fak_guard.base_url": '"http://127.0.0.1:5/v1"',
                     "model_providers.fak_guard.env_key": '"OPENAI_API_KEY"',
                     "model_providers.fak_guard.wire_api": '"responses"'}
    la = launch(["claude", "-p", "hi"], "anthropic", "http://127.0.0.1:5", {}, local_model=True)
    assert la.argv == ["claude", "-p", "hi"] and la.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:5"
    assert la.env["ANTHROPIC_API_KEY"] == "fak-local"  # in-kernel and no key: any key will do
    # its per-session billing line would make every session's prompt new from the first token (no prefix reuse)
    assert la.env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
    own = launch(["claude"], "anthropic", "http://127.0.0.1:5", {"CLAUDE_CODE_ATTRIBUTION_HEADER": "1"}, local_model=True)
    assert own.env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "1"  # the user's own setting stays
    assert "CLAUDE_CODE_ATTRIBUTION_HEADER" not in launch(["claude"], "anthropic", "http://127.0.0.1:5", {}).env


@pytest.mark.parametrize("argv,agent,provider", [(["claude"], "claude", "anthropic"), (["/usr/bin/codex"], "codex", "responses"),
                                                  (["aider"], "aider", "openai"), (["opencode"], "opencode", "openai"),
                                                  (["my-agent"], "my-agent", "anthropic")])
def test_provider_from_the_agents_name(argv: list[str], agent: str, provider: str) -> None:
    from fak.guard.agents import provider_for

    assert provider_for(argv, None) == provider


@pytest.mark.parametrize("args,message", [
    ([], "expected the agent's command after --"),
    (["--", "/nonexistent/agent-xyz"], "/nonexistent/agent-xyz: command not found"),
    (["--upstream", "ftp://x", "--", "true"], "--upstream 'ftp://x': expected an http:// or https:// URL"),
    (["--upstream", "http://x", "--gguf", "m", "--", "true"], "--upstream and --gguf exclude each other"),
    (["--provider", "bedrock", "--", "true"], "--provider 'bedrock': expected one of anthropic, openai, responses"),
    (["--policy", "/nonexistent.json", "--", "true"], "/nonexistent.json"),
    (["--gguf", "no-such-model", "--", "true"], "no-such-model"),
])
def test_bad_usage_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    r = guard("--no-journal", *args, cwd=tmp_path, env=dict(os.environ))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.stderr


@pytest.mark.slow
def test_sandbox_flags_one_line_and_exit_2(tmp_path: Path) -> None:
    """No bwrap on PATH: --sandbox on (the default) says how to install it; --sandbox off runs as before.
    And the sandbox will not make a whole home writable."""
    sb, env = sandbox(tmp_path)
    bare = dict(env, PATH=str(tmp_path / "empty"))  # no bwrap on it; the agent is named by its full path
    agent = [sys.executable, "-c", "print('ran')"]
    cases = [
        (["--no-journal", "--upstream", "http://127.0.0.1:9", "--", *agent], sb, bare,
         "bubblewrap (bwrap) is not installed; install it (apt-get install bubblewrap) or pass --sandbox off"),
        (["--no-journal", "--sandbox", "maybe", "--", "true"], sb, env, "--sandbox 'maybe': expected on or off"),
        (["--no-journal", "--sandbox", "off", "--allow-net", "pypi.org", "--", "true"], sb, env,
         "--allow-net needs --sandbox on"),
        (["--no-journal", "--allow-net", "a/b", "--", "true"], sb, env, "--allow-net 'a/b'"),
        (["--no-journal", "--", "true"], tmp_path / "home", env, "the project directory is your home directory"),
    ]
    for args, cwd, e, message in cases:
        r = guard(*args, cwd=cwd, env=e)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and message in lines[0], (args, r.stderr)
    with FakeUpstream() as up:
        r = guard("--no-journal", "--sandbox", "off", "--upstream", up.url, "--", *agent, cwd=sb, env=bare)
    assert r.returncode == 0 and r.stdout == "ran\n", r.stderr
    assert "fak guard: sandbox off" in r.stderr and "sandbox: off" in r.stderr


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
@pytest.mark.slow
def test_allow_net_reaches_the_named_host_only_and_the_summary_says_so(tmp_path: Path) -> None:
    """Inside the sandbox HTTPS_PROXY is the guard's allow-list proxy: a tunnel to the --allow-net host
    goes through, one to another host is refused with its reason, and the summary counts both."""
    import http.server
    import threading

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"allowed host says hi\n")

        def log_message(self, *a: object) -> None:
            pass

    host = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    port = host.server_address[1]
    sb, env = sandbox(tmp_path)
    (tmp_path / "allow.json").write_text(json.dumps({"version": "fak-policy/v1", "name": "all", "default": "allow"}))
    try:
        with FakeUpstream(allowed_and_destructive(f"curl -s -m 5 -p --noproxy '' http://127.0.0.1:{port}/",
                                                  "curl -s -m 5 https://example.com/ || echo refused-by-proxy")) as up:
            r = guard("--upstream", up.url, "--provider", "anthropic", "--no-journal", "--json", "--policy",
                      str(tmp_path / "allow.json"), "--allow-net", f"127.0.0.1:{port}", "--", sys.executable, STANDIN,
                      "--wire", "anthropic", "go", cwd=sb, env=env)
    finally:
        host.shutdown()
    assert r.returncode == 0, r.stderr
    assert "allowed host says hi" in r.stdout and "refused-by-proxy" in r.stdout
    assert f"net: gateway only + 127.0.0.1:{port} via proxy" in r.stderr.splitlines()[1]
    box = json.loads(r.stderr.strip().splitlines()[-1])["sandbox"]
    assert box["net_allowed"] == {f"127.0.0.1:{port}": 1} and box["net_refused_hosts"] == {"example.com:443": 1}
    assert "example.com:443 is not in --allow-net" in box["net_refused_reasons"]["example.com:443"]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
@pytest.mark.slow
def test_the_journal_inside_the_project_is_not_the_agents_to_change(tmp_path: Path) -> None:
    sb, env = sandbox(tmp_path)
    (tmp_path / "allow.json").write_text(json.dumps({"version": "fak-policy/v1", "name": "all", "default": "allow"}))
    with FakeUpstream(allowed_and_destructive("echo forged >> .fak/guard/*.jsonl", "rm -f .fak/guard/*.jsonl")) as up:
        r = guard("--upstream", up.url, "--policy", str(tmp_path / "allow.json"), "--", sys.executable, STANDIN,
                  "--wire", "anthropic", "go", cwd=sb, env=env)
    assert r.returncode == 0, r.stderr
    assert "Read-only file system" in r.stdout and "Device or resource busy" in r.stdout  # the write, the delete
    [journal] = (sb / ".fak" / "guard").glob("*.jsonl")
    v = subprocess.run([sys.executable, "-m", "commands.main", "audit", "verify", str(journal)], capture_output=True,
                       text=True)
    assert v.returncode == 0 and "OK, 2 records" in v.stdout


@pytest.mark.qwen
@pytest.mark.slow
def test_guard_on_the_in_kernel_model_with_no_network(tmp_path: Path) -> None:
    """`fak guard --gguf qwen2.5-coder-0.5b`: the in-kernel model proposes the calls (its serving loop
    adjudicates them with the guard's kernel); no upstream exists at all."""
    sb, env = sandbox(tmp_path)
    env = {k: v for k, v in env.items() if not k.endswith("_API_KEY")}  # none needed: in-kernel
    journal = tmp_path / "guard.jsonl"
    outs = []
    for command in ("echo ran > allowed.txt", "rm -rf ~"):
        r = guard("--gguf", "qwen2.5-coder-0.5b", "--journal", str(journal), "--json", "--", sys.executable, STANDIN,
                  "--wire", "anthropic", "--max-turns", "1", "--temperature", "0",
                  f"Use the Bash tool to run this exact command: {command}", cwd=sb, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        outs.append(r)
    assert (sb / "allowed.txt").read_text() == "ran\n"
    assert (tmp_path / "home" / "canary").exists()
    assert "$ rm" not in outs[1].stdout and "[fak] refused Bash: POLICY_BLOCK (delete " in outs[1].stdout
    rec = [json.loads(x) for x in journal.read_text().splitlines()]
    assert [(x["tool"], x["verdict"]) for x in rec] == [("Bash", "ALLOW"), ("Bash", "DENY")]
    assert json.loads(outs[1].stderr.strip().splitlines()[-1])["denied"] == 1
    v = subprocess.run([sys.executable, "-m", "commands.main", "audit", "verify", str(journal)], capture_output=True, text=True)
    assert v.returncode == 0
