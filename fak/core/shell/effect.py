"""What a tool call would do: an Effect is one action on one target, with the target's class.

The shell model (fak.core.shell) turns a command into effects; the file tools' arguments turn into them
directly. Policy v2 rules match on (effect kind, target class), so a refusal can say exactly what it
refused: `delete ~ (home)`.
"""

from __future__ import annotations

from dataclasses import dataclass

# Effect kinds. A rule names one of these.
KINDS = (
    "delete", "write", "chmod", "read", "read-secret", "send", "run-remote", "persist", "escalate", "kill",
    "teardown", "history", "tamper", "publish", "opaque", "exec",
)
# Target classes, from the most to the least sensitive. `unknown` is a target the model could not resolve
# (a variable set at run time, a command's output).
CLASSES = (
    "root", "device", "system", "credential", "agent-state", "home", "project-root", "project-git", "project-env", "project",
    "cache", "temp", "null", "network", "metadata", "process", "remote", "unknown",
)
SENSITIVE = frozenset({"root", "device", "system", "credential", "agent-state", "home", "project-root", "project-git",
                       "metadata"})


@dataclass(frozen=True, slots=True)
class Effect:
    kind: str  # one of KINDS
    target: str  # the target as the user would write it (~, /etc/passwd, origin main, 169.254.169.254)
    cls: str  # one of CLASSES
    how: str = ""  # the command or API that has the effect (rm -r, shutil.rmtree, curl -d @file)

    def __str__(self) -> str:
        return f"{self.kind} {self.target} ({self.cls})"
