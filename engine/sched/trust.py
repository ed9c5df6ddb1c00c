"""Trust on KV: the descriptor every cached (or transferred) KV span carries, and the hash seed of a scope.

A span's descriptor says who may reuse it (`scope`: a tenant; "" is the public scope, shared by
scope-less requests only), whether it was computed from content the kernel quarantined or never
admitted (`taint`: such a span is never offered to the prefix cache, so no other request maps it),
and the verdict that admitted its content (`verdict`: e.g. "ALLOW", "QUARANTINE"). Block hashes are
seeded by the scope: two scopes never hit each other's prefix blocks, so a prompt cache cannot leak
one tenant's prompts to another through time-to-first-token.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from engine.errors import EngineError

PUBLIC = ""  # the scope of requests that name none: today's behaviour, shared among them only


@dataclass(frozen=True)
class KVDescriptor:
    scope: str = PUBLIC
    taint: bool = False
    verdict: str = "ALLOW"

    def to_json(self) -> dict[str, Any]:
        return {"scope": self.scope, "taint": self.taint, "verdict": self.verdict}

    @classmethod
    def from_json(cls, d: Any) -> KVDescriptor:
        """The descriptor of a JSON object with exactly the keys scope, taint, verdict (else EngineError)."""
        if not isinstance(d, dict) or set(d) != {"scope", "taint", "verdict"}:
            raise EngineError(f"KV descriptor: expected an object with scope, taint, verdict, got {d!r}")
        if not isinstance(d["scope"], str) or not isinstance(d["taint"], bool) or not isinstance(d["verdict"], str):
            raise EngineError(f"KV descriptor: scope and verdict must be strings, taint a boolean: {d!r}")
        return cls(d["scope"], d["taint"], d["verdict"])


def scope_seed(scope: str) -> int:
    """The parent hash of a scope's first block: 0 for the public scope (the unscoped hashes, unchanged),
    else 64 bits of the scope's sha256 (stable across processes, unlike str hash())."""
    if scope == PUBLIC:
        return 0
    return int.from_bytes(hashlib.sha256(b"fak-kv-scope\0" + scope.encode()).digest()[:8], "little") or 1


UNSCOPED = KVDescriptor()  # public scope, clean, admitted: what a request that says nothing gets
