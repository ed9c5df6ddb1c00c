"""The real coding agents (Claude Code, Codex) as test subjects: where they are
installed, the argv and env that run them headless, offline and quiet against a
base URL on 127.0.0.1, and one bounded run.

    npm ci --prefix tests/agents          # installs the pinned CLIs (~800 MB)
    python tests/agents/run.py            # re-captures tests/agents/captured/*.json

Both CLIs are native binaries behind the npm package (no Node at run time).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Self

HERE = Path(__file__).resolve().parent
NODE_MODULES = HERE / "node_modules"
CAPTURED = HERE / "captured"

# The model Codex is run with: a catalogued model without `tool_mode`, so its tools
# arrive as plain top-level Responses tools (exec_command, apply_patch, ...). The
# default gpt-6.2-sol is "code_mode_only": one custom `exec` tool taking JavaScript
# that calls the real tools, the tools sent as an `additional_tools` input item.
CODEX_MODEL = "gpt-5.5"
CODEX_PROVIDER = "fak"

# Codex's own phone-home (update check, analytics, plugin / app / model-catalog sync
# with github.com, chatgpt.com, ab.chatgpt.com), all off
CODEX_QUIET = [
    "-c", "check_for_update_on_startup=false",
    "-c", "analytics.enabled=false",
    "-c", "feedback.enabled=false",
    "--disable", "plugins",
    "--disable", "remote_plugin",
    "--disable", "apps",
    "--disable", "api_key_model_discovery",
    "--disable", "in_app_updates",
    "--disable", "plugin_sharing",
]

# a proxy that refuses: anything not addressed to 127.0.0.1 / localhost fails at once
DEAD_PROXY = "http://127.0.0.1:9"


def bin_path(name: str) -> Path | None:
    """The installed CLI `name` ("claude" or "codex"), or None if not installed.

    Claude Code's bin/claude.exe is a stub until the package's postinstall copies the
    native binary over it (npm 11 warns that the script is not in allowScripts, but
    runs it); if it did not, the platform package's own binary is used."""
    p = NODE_MODULES / ".bin" / name
    if name == "claude" and p.exists() and p.stat().st_size < 1_000_000:
        native = NODE_MODULES / "@anthropic-ai" / "claude-code-linux-x64" / "claude"
        p = native if native.exists() else p
    return p if p.exists() and os.access(p, os.X_OK) else None


def version(name: str) -> str | None:
    """The pinned version of the agent's npm package, from its installed package.json."""
    pkg = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex"}[name]
    meta = NODE_MODULES / pkg / "package.json"
    return json.loads(meta.read_text())["version"] if meta.exists() else None


def agent_env(home: Path, **extra: str) -> dict[str, str]:
    """A clean env for either agent: a temp HOME, no proxy to the outside world
    (127.0.0.1 is direct, everything else hits a dead proxy), Claude Code's
    telemetry / auto-update / error reporting / nonessential traffic off.
    `extra` adds (or overrides) variables, e.g. ANTHROPIC_BASE_URL=...

    TMPDIR is a directory beside HOME, not above it: Codex will not create its sandbox helper (a
    codex-linux-sandbox alias on PATH) in a CODEX_HOME under the temp directory, and with a system
    bubblewrap installed its workspace-write sandbox needs that helper."""
    home.mkdir(parents=True, exist_ok=True)
    tmp = home.parent / f"{home.name}-tmp"
    tmp.mkdir(exist_ok=True)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "CI": "1",
        "HTTPS_PROXY": DEAD_PROXY,
        "HTTP_PROXY": DEAD_PROXY,
        "ALL_PROXY": DEAD_PROXY,
        "https_proxy": DEAD_PROXY,
        "http_proxy": DEAD_PROXY,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        # Claude Code: CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC alone stops every
        # api.anthropic.com connection seen in -p mode; the others are belt and braces
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_BUG_COMMAND": "1",
        "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1",
        "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
        "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
        # a failed or dropped stream is retried with backoff (0.6, 1.1, 2.3, 4.6, 9.3,
        # 19 s, ...: minutes by default); one retry keeps a failing test short
        "CLAUDE_CODE_MAX_RETRIES": "1",
    }
    env.update(extra)
    return env


def claude_argv(prompt: str, *, tools: str = "Bash", model: str | None = None) -> list[str]:
    """Claude Code headless: one prompt, `tools` pre-approved, a JSON result on stdout.
    Point it at the gateway with ANTHROPIC_BASE_URL (no /v1) and a dummy
    ANTHROPIC_API_KEY in the env."""
    exe = bin_path("claude")
    argv = [str(exe or "claude"), "-p", prompt, "--allowedTools", tools, "--output-format", "json"]
    if model:
        argv += ["--model", model]
    return argv


def claude_env(home: Path, base_url: str, **extra: str) -> dict[str, str]:
    return agent_env(home, ANTHROPIC_BASE_URL=base_url, ANTHROPIC_API_KEY="sk-ant-fak-dummy", **extra)


def codex_argv(
    prompt: str,
    base_url: str,
    env_key: str = "FAK_API_KEY",
    *,
    model: str = CODEX_MODEL,
    sandbox: str = "workspace-write",
    wire_api: str = "responses",
) -> list[str]:
    """`codex exec` against a custom provider at `base_url` (with /v1), the key read
    from env var `env_key`. `sandbox` "workspace-write" (the bundled bubblewrap works
    here) or "bypass" (--dangerously-bypass-approvals-and-sandbox). Approvals are
    "never" in exec mode either way; -c works before or after `exec`."""
    exe = bin_path("codex")
    p = CODEX_PROVIDER
    argv = [str(exe or "codex"), *CODEX_QUIET, "exec", "--skip-git-repo-check", "--ephemeral", "--color", "never"]
    argv += ["--dangerously-bypass-approvals-and-sandbox"] if sandbox == "bypass" else ["-s", sandbox]
    argv += [
        "-m", model,
        "-c", f"model_provider={p}",
        "-c", f"model_providers.{p}.name={p}",
        "-c", f'model_providers.{p}.base_url="{base_url}"',
        "-c", f"model_providers.{p}.env_key={env_key}",
        "-c", f'model_providers.{p}.wire_api="{wire_api}"',
        "-c", f"model_providers.{p}.request_max_retries=0",
        "-c", f"model_providers.{p}.stream_max_retries=0",
        prompt,
    ]
    return argv


def codex_guarded_argv(prompt: str, *, model: str = CODEX_MODEL, sandbox: str | None = None) -> list[str]:
    """`codex exec` as a user types it under `fak guard`: no provider flags (the guard adds its own), and
    by default no sandbox flag either: under `--sandbox on` the guard's sandbox replaces Codex's own
    (a bubblewrap cannot nest in another), which the guard sets; "bypass" or a mode to pass one."""
    exe = bin_path("codex")
    argv = [str(exe or "codex"), *CODEX_QUIET, "exec", "--skip-git-repo-check", "--ephemeral", "--color", "never"]
    if sandbox is not None:
        argv += ["--dangerously-bypass-approvals-and-sandbox"] if sandbox == "bypass" else ["-s", sandbox]
    return [*argv, "-m", model, prompt]


def codex_env(home: Path, env_key: str = "FAK_API_KEY", **extra: str) -> dict[str, str]:
    return agent_env(home, **{env_key: "sk-fak-dummy", **extra})


class RefusingProxy:
    """An HTTP(S) proxy on 127.0.0.1 that refuses everything and records what was
    asked of it (`CONNECT api.anthropic.com:443 HTTP/1.1`, ...): pass its url as
    HTTPS_PROXY to see whether an agent tries to phone home."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    line = conn.makefile("rb").readline(4096).decode("latin-1").strip()
                    self.asked.append(line)
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass

    def env(self) -> dict[str, str]:
        return {k: self.url for k in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy")}

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sock.close()


@dataclass
class Run:
    argv: list[str]
    returncode: int | None  # None: killed on timeout
    stdout: str
    stderr: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def run_agent(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 120) -> Run:
    """Run one agent to completion in its own process group; on timeout kill the group."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    return Run(argv, code, out, err, time.monotonic() - t0)


# -- re-capturing the request bodies --------------------------------------------------


def scrub(body: dict, workdir: Path, home: Path) -> dict:
    """A captured body without what is specific to this machine or run: paths,
    ids, dates (the tools array is left exactly as sent)."""
    text = json.dumps(body)
    for path, placeholder in ((str(workdir), "/work/project"), (str(home), "/home/user")):
        text = text.replace(path, placeholder)
    text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                  "00000000-0000-0000-0000-000000000000", text)
    text = re.sub(r"\b[0-9a-f]{64}\b", "0" * 64, text)
    text = re.sub(r"\b20\d\d-\d\d-\d\d\b", "2026-01-01", text)
    text = re.sub(r"OS Version: [^\\]*", "OS Version: Linux", text)
    return json.loads(text)


def capture(out: Path = CAPTURED) -> None:
    """Run both agents against a fake upstream proposing one harmless shell call;
    save each one's first request body."""
    import tempfile

    sys.path.insert(0, str(HERE.parent))
    from support.fake_upstream import FakeUpstream, first_turn

    out.mkdir(exist_ok=True)
    # (agent, model, file suffix): Codex twice, as tested (plain tools) and with its
    # default model (code mode: the tools inside an `additional_tools` input item)
    for name, model, suffix in (("claude", None, ""), ("codex", CODEX_MODEL, ""), ("codex", "gpt-6.2-sol", "-code-mode")):
        if bin_path(name) is None:
            print(f"{name}: not installed (npm ci --prefix tests/agents)")
            continue
        with tempfile.TemporaryDirectory() as tmp, FakeUpstream(first_turn("echo ran > allowed.txt")) as up:
            home, work = Path(tmp) / "home", Path(tmp) / "work"
            work.mkdir()
            if name == "claude":
                argv, env = claude_argv("Create allowed.txt"), claude_env(home, up.url)
                target = out / f"claude-code-{version('claude')}.json"
            else:
                argv, env = codex_argv("Create allowed.txt", up.url + "/v1", model=model or CODEX_MODEL), codex_env(home)
                target = out / f"codex-{version('codex')}{suffix}.json"
            run = run_agent(argv, env, work)
            calls = up.calls()
            print(f"{name} {model or ''}: rc={run.returncode} {run.seconds:.1f}s, {len(up.requests)} requests:",
                  [(r.method, r.path + ("?" + r.query if r.query else ""), r.body.get("model")) for r in up.requests])
            if calls:
                target.write_text(json.dumps(scrub(calls[0].body, work, home), indent=1, ensure_ascii=False) + "\n")
                print(f"  -> {target.relative_to(HERE.parent.parent)} ({target.stat().st_size // 1024} KB)")


if __name__ == "__main__":
    capture()
