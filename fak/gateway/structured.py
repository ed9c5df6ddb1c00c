"""Structured output and forced tool calls as engine grammars (engine.grammar.GrammarSpec).

- `response_format` (OpenAI Chat), `text.format` (Responses), `output_config.format` (Anthropic):
  json_object -> any JSON object, json_schema -> JSON matching the schema.
- A forced call (`tool_choice` "required" / a named function; Anthropic "any" / "tool"): the output
  is one call in the form the model's parser reads back, with arguments matching that tool's
  parameters schema. Hermes/Qwen, Llama 3 and generic parsers all read a reply that is exactly one
  JSON call object, `{"name": ..., "arguments": {...}}`; Mistral's needs its `[TOOL_CALLS]` list.
  The call then goes through the kernel like any other: forcing a call never bypasses adjudication.
"""

from __future__ import annotations

import json
from typing import Any

from engine.grammar import GrammarSpec
from fak.gateway.errors import APIError

_SEPARATORS = (", ", ": ")  # forced separators: no room for the model to loop on whitespace


def json_format(fmt: dict[str, Any] | None, param: str) -> GrammarSpec | None:
    """A response-format object ({"type": "text" | "json_object" | "json_schema", ...}) as a grammar.

    The schema sits under "json_schema": {"schema": ...} (OpenAI Chat) or directly under "schema"
    (Responses' text.format, Anthropic's output_config.format)."""
    if fmt is None:
        return None
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec.json_object()
    if kind == "json_schema":
        holder = fmt.get("json_schema", fmt)
        schema = holder.get("schema") if isinstance(holder, dict) else None
        if not isinstance(schema, dict):
            raise APIError(400, f"{param}: json_schema needs a schema object", param=param)
        return GrammarSpec.json_schema(schema)
    raise APIError(400, f"{param}: type {kind!r} is not supported (text, json_object, json_schema)", param=param)


def forced_call(family: type | None, tools: dict[str, dict[str, Any] | None], name: str | None,
                param: str = "tool_choice") -> GrammarSpec:
    """One call of tool `name` (or of any offered tool when name is None) in the model's call form."""
    if name is not None and name not in tools:
        raise APIError(400, f"{param}: tool {name!r} is not among the offered tools", param=param)
    chosen = [name] if name is not None else list(tools)
    if not chosen:
        raise APIError(400, f"{param}: forcing a call needs tools", param=param)
    mistral = family is not None and family.__name__ == "MistralParser"
    calls = []
    for n in chosen:
        schema = tools[n] or {"type": "object"}
        head = f'{{"name": {json.dumps(n, ensure_ascii=False)}, "arguments": '
        args = GrammarSpec.json_schema(schema, _SEPARATORS)
        calls.append(GrammarSpec.sequence(f"[TOOL_CALLS][{head}", args, "}]") if mistral
                     else GrammarSpec.sequence(head, args, "}"))
    return calls[0] if len(calls) == 1 else GrammarSpec.choice(*calls)
