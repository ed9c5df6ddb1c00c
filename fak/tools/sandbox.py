"""`sandbox` engine: runs the built-in tools inside one working directory.

    kernel = Kernel.with_policy(coding_floor(), engines={"sandbox": SandboxTools(root)}, default_engine="sandbox")
    kernel.syscall(ToolCall.from_args("Bash", {"command": "pytest -q"}, meta={"cwd": root}))

The engine confines (paths stay under root, Bash runs there with a built environment, a timeout and an
output cap, inside the OS sandbox when bubblewrap is there: `os_sandbox` None = when bwrap exists, True =
required, False = off); the kernel in front of it decides what may run at all. Every failure is an error Result,
never an exception: a model's bad call is information for its next turn.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from fak.core.abi import Result, Status, ToolCall
from fak.sandbox import contain, find_bwrap, require_bwrap
from fak.tools import files, search
from fak.tools.confine import Root, ToolError, need_str
from fak.tools.shell import MAX_TIMEOUT, run_shell
from fak.tools.specs import TOOL_NAMES

_FILE_TOOLS: dict[str, Callable[[Root, dict[str, Any]], str]] = {
    "Read": files.read, "Write": files.write, "Edit": files.edit, "Glob": search.glob, "Grep": search.grep,
}


class SandboxTools:
    """Read, Glob, Grep, Write, Edit, Bash under `root`. `home` is what `~` and $HOME name (default root)."""

    engine_id = "sandbox"

    def __init__(self, root: str | os.PathLike[str], bash_timeout: float = 30.0,
                 home: str | os.PathLike[str] | None = None, os_sandbox: bool | None = None, **_ignored: Any) -> None:
        self.root = Root(root, home)
        self.bash_timeout = float(bash_timeout)
        self.bwrap = require_bwrap("the sandbox engine") if os_sandbox else find_bwrap() if os_sandbox is None else None
        # Bash's sandbox: the root writable, HOME the engine's home, its credential stores and the user's hidden
        self.box = contain(self.root.path, self.root.home, who="the sandbox engine") if self.bwrap else None

    def caps(self) -> dict[str, Any]:
        return {"engine": "sandbox", "root": str(self.root.path), "tools": list(TOOL_NAMES),
                "bash_timeout": self.bash_timeout, "streaming": False, "os_sandbox": "bwrap" if self.box else "off"}

    def complete(self, call: ToolCall) -> Result:
        try:
            args = call.args_obj
        except ValueError as exc:
            return Result.error(f"{call.tool}: arguments are not valid JSON: {exc}", engine="sandbox")
        if not isinstance(args, dict):
            return Result.error(f"{call.tool}: arguments must be a JSON object", engine="sandbox")
        try:
            if call.tool == "Bash":
                return self._bash(args)
            fn = _FILE_TOOLS.get(call.tool)
            if fn is None:
                return Result.error(f"unknown tool {call.tool!r} (known: {', '.join(TOOL_NAMES)})", engine="sandbox")
            return Result({"text": fn(self.root, args)}, Status.OK, {"engine": "sandbox"})
        except ToolError as exc:
            return Result.error(f"{call.tool}: {exc}", engine="sandbox")
        except OSError as exc:
            return Result.error(f"{call.tool}: {exc.strerror or exc}", engine="sandbox")

    def _bash(self, args: dict[str, Any]) -> Result:
        command = need_str(args, "command") or ""
        if not command.strip():
            raise ToolError("empty command")
        # Claude Code's `timeout` is in milliseconds; the engine's own default is in seconds
        ms = args.get("timeout")
        if isinstance(ms, str):
            try:
                ms = float(ms)
            except ValueError:
                raise ToolError(f"argument 'timeout': expected milliseconds, got {ms!r}") from None
        if ms is not None and (not isinstance(ms, (int, float)) or isinstance(ms, bool) or ms <= 0):
            raise ToolError(f"argument 'timeout': expected milliseconds > 0, got {ms!r}")
        timeout = min(float(ms) / 1000.0 if ms is not None else self.bash_timeout, MAX_TIMEOUT)
        if not self.root.path.is_dir():
            raise ToolError(f"the working directory {self.root.path} is gone")
        run = run_shell(command, self.root.path, self.root.home, timeout, self.box, self.bwrap or "bwrap")
        payload = {"text": run.text(timeout), "exit_code": run.exit_code}
        if run.timed_out:
            payload["error"] = f"Bash: timed out after {timeout:g} s"
            return Result(payload, Status.ERROR, {"engine": "sandbox", "timed_out": True})
        return Result(payload, Status.OK, {"engine": "sandbox", "exit_code": run.exit_code})
