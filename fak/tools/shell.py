"""Bash: one command in `bash -c`, cwd the root, HOME the sandbox's home, a timeout, output capped; inside
the OS sandbox (fak/sandbox: bubblewrap, the root writable, the rest read-only, credential stores hidden,
no network) when the engine has one.

The environment is built, not inherited: PATH (this Python's directory first, so `python` is the one
running fak), HOME, LANG, TERM. The agent's own credentials in the parent's environment never reach
a command the model wrote. The whole process group is killed on timeout, so a backgrounded child
cannot outlive the call (in the OS sandbox, killing bwrap ends its pid namespace: everything inside).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from fak.sandbox import SandboxSpec, bwrap_argv

OUTPUT_CAP = 30 * 1024  # bytes of output kept; the rest is counted and said to be cut
MAX_TIMEOUT = 600.0


@dataclass(slots=True)
class ShellRun:
    output: str
    exit_code: int | None  # None: killed on timeout
    timed_out: bool
    total_bytes: int

    def text(self, timeout: float) -> str:
        out = self.output
        notes = []
        if self.total_bytes > OUTPUT_CAP:
            notes.append(f"[output cut: first {OUTPUT_CAP} of {self.total_bytes} bytes shown]")
        if self.timed_out:
            notes.append(f"[timed out after {timeout:g} s: killed]")
        elif self.exit_code:
            notes.append(f"[exit code {self.exit_code}]")
        if not out and not notes:
            return "(no output)"
        return "\n".join(([out.rstrip("\n")] if out else []) + notes)


def sandbox_env(home: Path) -> dict[str, str]:
    here = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "/usr/bin:/bin")
    return {"PATH": f"{here}:{path}" if here else path, "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb",
            "PYTHONDONTWRITEBYTECODE": "1"}


def run_shell(command: str, cwd: Path, home: Path, timeout: float, box: SandboxSpec | None = None,
              bwrap: str = "bwrap") -> ShellRun:
    argv = ["bash", "-c", command]
    if box is not None:
        argv = bwrap_argv(box, argv, bwrap=bwrap)
    proc = subprocess.Popen(argv, cwd=cwd, env=sandbox_env(home), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    kept = bytearray()
    total = [0]

    def drain() -> None:  # read everything (so the child never blocks on a full pipe), keep the head
        assert proc.stdout is not None
        while chunk := proc.stdout.read1(65536):
            total[0] += len(chunk)
            if len(kept) < OUTPUT_CAP:
                kept.extend(chunk[: OUTPUT_CAP - len(kept)])

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    if timed_out or proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    else:
        try:  # the shell exited; a child it left in the background still holds the pipe
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    reader.join(timeout=5)
    if proc.stdout is not None:
        proc.stdout.close()
    return ShellRun(kept.decode("utf-8", "replace"), None if timed_out else proc.returncode, timed_out, total[0])
