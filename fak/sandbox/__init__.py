"""The OS sandbox behind the policy: bubblewrap with the project writable, credential stores hidden, and no
network but unix sockets relayed in. Exports SandboxSpec, Relay, contain, bwrap_argv, require_bwrap, Session."""

from fak.sandbox.bwrap import CREDENTIALS, Relay, SandboxSpec, bwrap_argv, check_project, contain, find_bwrap, require_bwrap
from fak.sandbox.session import Session

__all__ = ["CREDENTIALS", "Relay", "SandboxSpec", "Session", "bwrap_argv", "check_project", "contain", "find_bwrap",
           "require_bwrap"]
