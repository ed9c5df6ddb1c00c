"""GrammarSpec: what a constrained request's output must match, as plain data (hashable: the compile
cache's key). No grammar library is named here; engine/grammar/compile.py turns a spec into one.

    GrammarSpec.json_object()                          # any JSON object
    GrammarSpec.json_schema({"type": "object", ...})   # JSON matching a schema
    GrammarSpec.regex(r"[0-9]{3}-[0-9]{4}")            # text matching a regex (the whole output)
    GrammarSpec.sequence("<tool_call>\\n", GrammarSpec.json_schema(s), "\\n</tool_call>")  # literal + JSON + literal
    GrammarSpec.choice(call_a, call_b)                 # one of several

`sequence` and `choice` take specs or str (a str is a literal) and nest. JSON nodes take `separators`
as json.dumps does: None (default) lets the model put JSON whitespace between tokens, at most
`MAX_WHITESPACE` characters per gap (so it cannot loop on blanks until max_new_tokens); a pair like
(", ", ": ") forces exactly those separators and no other whitespace.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine.errors import EngineError

MAX_WHITESPACE = 32  # characters of JSON whitespace allowed in one gap (separators=None)
KINDS = ("json", "regex", "literal", "sequence", "choice")


@dataclass(frozen=True)
class GrammarSpec:
    kind: str  # one of KINDS
    text: str = ""  # json: the schema as compact JSON text; regex: the pattern; literal: the text
    parts: tuple[GrammarSpec, ...] = ()  # sequence / choice
    separators: tuple[str, str] | None = None  # json: (item, key) separators; None: flexible whitespace

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise EngineError(f"grammar kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind == "choice" and not self.parts:
            raise EngineError("grammar choice needs at least one alternative")
        if self.separators is not None:
            item, key = self.separators
            if item.strip() != "," or key.strip() != ":":
                raise EngineError(f"JSON separators must be ',' and ':' with optional spaces, got {self.separators!r}")

    # -- constructors
    @classmethod
    def json_object(cls, separators: tuple[str, str] | None = None) -> GrammarSpec:
        """Any JSON object (OpenAI's response_format json_object)."""
        return cls.json_schema({"type": "object"}, separators)

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str, separators: tuple[str, str] | None = None) -> GrammarSpec:
        """JSON matching `schema` (a dict, or its JSON text). Whether the schema is valid is decided when a
        request with it is admitted (EngineError there); here only that it is a JSON object."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise EngineError(f"JSON schema is not valid JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise EngineError(f"a JSON schema must be an object, got {type(schema).__name__}")
        try:
            text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise EngineError(f"JSON schema is not serializable as JSON: {exc}") from None
        return cls("json", text, separators=tuple(separators) if separators is not None else None)  # type: ignore[arg-type]

    @classmethod
    def regex(cls, pattern: str) -> GrammarSpec:
        """Text matching `pattern` as a whole (Rust regex syntax; no anchors, no lookaround)."""
        if not isinstance(pattern, str) or not pattern:
            raise EngineError("a grammar regex must be a non-empty string")
        return cls("regex", pattern)

    @classmethod
    def literal(cls, text: str) -> GrammarSpec:
        """Exactly `text`."""
        if not isinstance(text, str):
            raise EngineError(f"a grammar literal must be a string, got {type(text).__name__}")
        return cls("literal", text)

    @classmethod
    def sequence(cls, *parts: GrammarSpec | str) -> GrammarSpec:
        """Each part in turn (a str is a literal)."""
        return cls("sequence", parts=tuple(_part(p) for p in parts))

    @classmethod
    def choice(cls, *alternatives: GrammarSpec | str) -> GrammarSpec:
        """Exactly one of the alternatives (a str is a literal)."""
        return cls("choice", parts=tuple(_part(p) for p in alternatives))

    @property
    def schema(self) -> dict[str, Any]:
        """A json node's schema, as a dict."""
        if self.kind != "json":
            raise EngineError(f"a {self.kind} grammar has no JSON schema")
        return dict(json.loads(self.text))


def _part(p: GrammarSpec | str) -> GrammarSpec:
    if isinstance(p, GrammarSpec):
        return p
    if isinstance(p, str):
        return GrammarSpec.literal(p)
    raise EngineError(f"a grammar part must be a GrammarSpec or a str, got {type(p).__name__}")
