"""`fak chat`: through a pseudo-terminal on the instruct model (two turns with the KV cache reused,
Ctrl-C stopping a reply, /reset, /save and /load), piped (plain text), against any OpenAI-compatible
server (--base-url: here the scripted fake), bad input one line and exit 2."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fak.chat.conversation import Conversation
from fak.chat.status import TurnStats
from fak.errors import FakError
from support import paths
from support.fake_upstream import FakeUpstream

pytestmark = pytest.mark.slow  # boots a model or a server per module: the full suite runs it

FAK = [sys.executable, "-m", "commands.main"]
REPO = paths.REPO


def chat(*args: str, stdin: str = "", cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([*FAK, "chat", *args], input=stdin, capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=env)


def test_transcript_round_trip_and_bad_files(tmp_path: Path) -> None:
    c = Conversation("be brief", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], 0.2, True)
    c.save(str(tmp_path / "t.json"))
    back = Conversation.load(str(tmp_path / "t.json"))
    assert (back.system, back.messages, back.temperature, back.tools) == (c.system, c.messages, 0.2, True)
    (tmp_path / "bad.json").write_text('{"version": "fak-chat/v1", "messages": [{"role": "robot"}]}')
    for name, msg in (("bad.json", "field 'messages'"), ("missing.json", "cannot read")):
        with pytest.raises(FakError, match=msg):
            Conversation.load(str(tmp_path / name))
    (tmp_path / "other.json").write_text("[1, 2]")
    with pytest.raises(FakError, match="not a fak chat transcript"):
        Conversation.load(str(tmp_path / "other.json"))


def test_status_line() -> None:
    s = TurnStats(prompt=840, cached=812, generated=34, decode_s=0.8, calls=1)
    assert s.line(32768) == ("reused 812/840 prompt tokens · 28 prefilled · 34 generated · 41.2 tok/s · "
                             "context 874/32768")


def test_piped_chat_through_a_base_url_prints_plain_text() -> None:
    with FakeUpstream(text="Paris is the capital.") as up:
        r = chat("--base-url", up.url + "/v1", stdin="Capital of France?\n/model\nAnd of Italy?\n", timeout=60)
        bodies = [q.body for q in up.calls("chat")]
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:1] == ["Paris is the capital."] and "\x1b[" not in r.stdout  # no escapes
    assert "fake-model · " in r.stdout  # /model
    assert len(re.findall(r"^reused \d+/\d+ prompt tokens", r.stderr, re.M)) == 2
    # the second turn carries the first one: history kept
    assert [m["role"] for m in bodies[1]["messages"]] == ["user", "assistant", "user"]
    assert bodies[1]["messages"][1]["content"] == "Paris is the capital."


@pytest.mark.parametrize("args,message", [
    (["--base-url", "http://127.0.0.1:9/v1"], "--base-url http://127.0.0.1:9/v1: no OpenAI-compatible server"),
    (["--gguf", "no-such-model"], "no-such-model"),
    (["--temp", "5"], "--temp 5.0: expected a number from 0 to 2"),
    (["--gguf", "x", "--base-url", "http://h"], "--gguf and --base-url exclude each other"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    r = chat(*args, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and message in lines[0] and "Traceback" not in r.stderr


SYSTEM = "You are a terse assistant. Answer in as few words as you can. " * 6  # > 64 tokens: one reusable chunk


@pytest.mark.qwen
def test_terminal_chat_two_turns_reuse_the_kv_cache_and_ctrl_c_stops_a_reply(tmp_path: Path) -> None:
    import pexpect

    env = dict(os.environ, PROMPT_TOOLKIT_NO_CPR="1", TERM="xterm", PYTHONPATH=str(REPO),
               XDG_CACHE_HOME=str(tmp_path / "cache"))
    c = pexpect.spawn(sys.executable, ["-m", "commands.main", "chat", "--temp", "0", "--system", SYSTEM], env=env,
                      encoding="utf-8", timeout=240, dimensions=(40, 120), cwd=str(tmp_path))
    try:
        c.expect("›")
        status = r"reused (\d+)/(\d+) prompt tokens · (\d+) prefilled · (\d+) generated"
        c.send("What is 2+2? Answer in one word.\r")
        c.expect(status)
        cached1, prompt1, prefilled1, gen1 = map(int, c.match.groups())
        c.expect("›")
        c.send("And 3+3?\r")
        c.expect(status)
        cached2, prompt2, prefilled2, gen2 = map(int, c.match.groups())
        assert cached1 == 0 and prefilled1 == prompt1
        # turn 2 = turn 1's prompt + reply + the new message: all of turn 1 that fills whole 64-token
        # chunks is read from the cache (hits are chunk-aligned so the KV stays bit-identical to a
        # cold prefill), so what is prefilled is the new message and < 64 tokens of the old tail
        new = prompt2 - prompt1 - gen1
        assert cached2 == (prompt1 + gen1 - 1) // 64 * 64 > 0
        assert prefilled2 == prompt2 - cached2 and new <= prefilled2 < new + 64
        c.expect("›")
        c.send("Count from 1 to 300, one number per line, nothing else.\r")
        c.expect(r"\b17\b")  # well into a reply hundreds of tokens long
        c.send("\x03")  # Ctrl-C during the reply
        c.expect("reply stopped")
        c.expect("›")  # the session goes on
        t = tmp_path / "t.json"
        c.send(f"/save {t}\r")
        c.expect(r"saved (\d+) messages")
        assert c.match.group(1) == "4"  # the cut turn left nothing behind
        c.send("/reset\r")
        c.expect("conversation cleared")
        c.send(f"/save {tmp_path / 'empty.json'}\r")
        c.expect("saved 0 messages")
        c.send(f"/load {t}\r")
        c.expect("loaded 4 messages")
        c.send("/stats\r")
        c.expect("prefix cache")  # the engine panel, live from the in-kernel server
        c.expect(r"(\d+)/(\d+) hits")
        assert int(c.match.group(1)) >= 1
        c.expect(r"(\d+) requests · (\d+) 5xx")
        assert c.match.group(2) == "0"
        c.send("/bogus\r")
        c.expect("unknown command /bogus")
        c.send("/exit\r")
        c.expect(pexpect.EOF)
    finally:
        c.close(force=True)
    saved = json.loads(t.read_text())
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant", "user", "assistant"]
    assert saved["system"] == SYSTEM
    assert (tmp_path / "cache" / "fak" / "chat_history").read_text().count("What is 2+2?") == 1


def test_a_chat_resumed_in_a_new_process_reuses_its_kv_from_disk(tmp_path: Path) -> None:
    """KV that survives a restart: a conversation saved and loaded in a new `fak chat` process maps its
    history from ~/.cache/fak/kv (here FAK_KV_CACHE_DIR) instead of prefilling it again."""
    import pexpect

    env = dict(os.environ, PROMPT_TOOLKIT_NO_CPR="1", TERM="xterm", PYTHONPATH=str(REPO),
               XDG_CACHE_HOME=str(tmp_path / "cache"), FAK_KV_CACHE_DIR=str(tmp_path / "kv"))
    status = r"reused (\d+)/(\d+) prompt tokens · (\d+) prefilled · (\d+) generated"
    t = tmp_path / "t.json"

    def session() -> pexpect.spawn:
        c = pexpect.spawn(sys.executable, ["-m", "commands.main", "chat", "--temp", "0", "--system", SYSTEM],
                          env=env, encoding="utf-8", timeout=240, dimensions=(40, 120), cwd=str(tmp_path))
        c.expect("›")
        return c

    c = session()
    try:
        c.send("Name three colours of the rainbow, in one line.\r")
        c.expect(status)
        cached1, prompt1, _, gen1 = map(int, c.match.groups())
        assert cached1 == 0
        c.expect("›")
        c.send(f"/save {t}\r")
        c.expect("saved 2 messages")
        c.send("/exit\r")
        c.expect(pexpect.EOF)
    finally:
        c.close(force=True)
    assert list((tmp_path / "kv").rglob("*.kv"))  # the first process left its blocks on disk
    c = session()  # tomorrow: a new process, nothing in memory
    try:
        c.send(f"/load {t}\r")
        c.expect("loaded 2 messages")
        c.expect("›")
        c.send("And two more?\r")
        c.expect(status)
        cached2, prompt2, prefilled2, _ = map(int, c.match.groups())
        assert cached2 == (prompt1 + gen1 - 1) // 64 * 64 > 0  # what the first process computed, from disk
        assert prefilled2 == prompt2 - cached2
        c.send("/exit\r")
        c.expect(pexpect.EOF)
    finally:
        c.close(force=True)


def _sandbox(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (home / "canary").write_text("alive\n")
    (work / "notes.txt").write_text("buy milk\n")
    return work, dict(os.environ, HOME=str(home), PYTHONPATH=str(REPO))


def test_tools_each_call_judged_allowed_run_destructive_refused(tmp_path: Path) -> None:
    """--tools against a model (the scripted fake) proposing a Read inside the directory and `rm -rf ~`:
    the Read runs and its result goes back, the Bash is refused and never runs, both journaled."""
    work, env = _sandbox(tmp_path)

    def propose(offer):  # type: ignore[no-untyped-def]
        return [] if offer.followup else [("Read", {"file_path": "notes.txt"}), ("Bash", {"command": "rm -rf ~"})]

    with FakeUpstream(propose, text="Done.") as up:
        r = subprocess.run([*FAK, "chat", "--tools", "--base-url", up.url, "--journal", str(tmp_path / "j.jsonl")],
                           input="read my notes\n", capture_output=True, text=True, timeout=60, cwd=work, env=env)
        followup = up.followups()
    assert r.returncode == 0, r.stderr
    assert 'tool Read {"file_path": "notes.txt"} -> ALLOW' in r.stderr
    assert 'tool Bash {"command": "rm -rf ~"} -> DENY POLICY_BLOCK (delete ' in r.stderr
    assert (tmp_path / "home" / "canary").exists()
    sent = followup[0].body["messages"]
    results = [m["content"] for m in sent if m["role"] == "tool"]
    assert "buy milk" in results[0] and results[1].startswith("[fak] refused Bash: POLICY_BLOCK")
    assert [t["function"]["name"] for t in followup[0].body["tools"]] == ["Read", "Glob", "Grep", "Write", "Edit", "Bash"]
    rec = [json.loads(x) for x in (tmp_path / "j.jsonl").read_text().splitlines()]
    assert [(x["tool"], x["verdict"]) for x in rec] == [("Read", "ALLOW"), ("Bash", "DENY")]


needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
KEY = "fak-planted-private-key"


@needs_bwrap
@pytest.mark.parametrize("sandbox", ["auto", "off"])
def test_tools_bash_runs_inside_the_sandbox(tmp_path: Path, sandbox: str) -> None:
    """The policy lets everything through (on purpose); `--sandbox auto` (bwrap is here) still keeps the
    model's Bash from reading the user's ~/.ssh key and from writing outside the directory; `off` does not."""
    work, env = _sandbox(tmp_path)
    home, outside = tmp_path / "home", tmp_path / "outside"
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_ed25519").write_text(KEY + "\n")
    outside.mkdir()
    (tmp_path / "allow.json").write_text(json.dumps({"version": "fak-policy/v1", "name": "allow-all", "default": "allow"}))
    command = f"echo in > inside.txt; cat {home}/.ssh/id_ed25519; echo out > {outside}/escape.txt"

    def propose(offer):  # type: ignore[no-untyped-def]
        return [] if offer.followup else [("Bash", {"command": command})]

    with FakeUpstream(propose, text="Done.") as up:
        r = subprocess.run([*FAK, "chat", "--tools", "--sandbox", sandbox, "--policy", str(tmp_path / "allow.json"),
                            "--base-url", up.url], input="go\n", capture_output=True, text=True, timeout=60, cwd=work,
                           env=env)
        followup = up.followups()
    assert r.returncode == 0, r.stderr
    [result] = [m["content"] for m in followup[0].body["messages"] if m["role"] == "tool"]
    assert (work / "inside.txt").read_text() == "in\n"  # the directory is writable either way
    if sandbox == "auto":
        assert KEY not in result and not (outside / "escape.txt").exists()
    else:
        assert KEY in result and (outside / "escape.txt").exists()


def test_tools_sandbox_on_without_bwrap_is_one_line(tmp_path: Path) -> None:
    work, env = _sandbox(tmp_path)
    env["PATH"] = str(tmp_path / "empty")  # no bwrap on it
    r = subprocess.run([*FAK, "chat", "--tools", "--sandbox", "on", "--base-url", "http://127.0.0.1:9"],
                       input="", capture_output=True, text=True, timeout=60, cwd=work, env=env)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "apt-get install bubblewrap" in lines[0]


@pytest.mark.qwen
def test_terminal_tools_on_the_in_kernel_model(tmp_path: Path) -> None:
    """The in-kernel model proposes the calls: a Read inside the directory is allowed and shown, a
    destructive Bash it is asked for is shown red as DENY and never runs."""
    import pexpect

    work, env = _sandbox(tmp_path)
    env.update(PROMPT_TOOLKIT_NO_CPR="1", TERM="xterm", XDG_CACHE_HOME=str(tmp_path / "cache"))
    c = pexpect.spawn(sys.executable, ["-m", "commands.main", "chat", "--tools", "--temp", "0", "--max-tokens", "96"], env=env,
                      encoding="utf-8", timeout=240, dimensions=(40, 160), cwd=str(work))
    out = []
    try:
        c.expect("›")
        c.send("Use the Read tool to read the file notes.txt\r")
        c.expect(r"⚙ Read\S*\s+\{\"file_path\": \"[^\"]*notes.txt\"[^}]*\}\s+\S*→ ALLOW")
        c.expect("buy milk")
        c.expect("reused")
        c.expect("›")
        c.send("Use the Bash tool to run this exact command: rm -rf ~\r")
        c.expect("✗ Bash")
        out.append(c.before + c.after)
        c.expect(r"→ DENY POLICY_BLOCK")
        out.append(c.before + c.after)
        c.expect("reused")
        c.expect("›")
        c.sendcontrol("d")  # Ctrl-D at the prompt ends the session
        c.expect(pexpect.EOF)
    finally:
        c.close(force=True)
    assert "\x1b[1;31m" in "".join(out)  # shown in red
    assert (tmp_path / "home" / "canary").exists()
