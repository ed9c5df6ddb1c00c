"""Chat templates: the GGUF's `tokenizer.chat_template` rendered like transformers'
`apply_chat_template` (sandboxed jinja2, same variables and helpers), or a built-in fallback.

Fallbacks (when the GGUF has no template), chosen by the vocabulary:
- Gemma (`<start_of_turn>` in the vocab): Gemma 3's turn format; a system message is folded into
  the first user turn ("system\\n\\nuser"), "assistant" is spelled "model", contents are trimmed.
- Llama 3 (`<|start_header_id|>`), else ChatML (`<|im_start|>`, also the choice for byte vocabs).
Fallbacks render `tools` as a JSON list in the system part (the models have no native format).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import EngineError

_TOOLS_BLOCK = (
    "{%- if tools -%}"
    "{%- set tools_text = 'You can call these tools (JSON schema):\\n' + (tools | tojson(indent=2)) -%}"
    "{%- else -%}{%- set tools_text = '' -%}{%- endif -%}"
)

GEMMA_TEMPLATE = _TOOLS_BLOCK + """{{ bos_token }}
{%- if messages and messages[0]['role'] == 'system' -%}
  {%- set sys = messages[0]['content'] if messages[0]['content'] is string else messages[0]['content'][0]['text'] -%}
  {%- set turns = messages[1:] -%}
{%- else -%}
  {%- set sys = '' -%}
  {%- set turns = messages -%}
{%- endif -%}
{%- if tools_text -%}{%- set sys = (sys + '\\n\\n' + tools_text) if sys else tools_text -%}{%- endif -%}
{%- for m in turns -%}
  {%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}
    {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
  {%- endif -%}
  {{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' }}
  {%- if loop.first and sys -%}{{ sys + '\\n\\n' }}{%- endif -%}
  {%- if m['content'] is string -%}
    {{ m['content'] | trim }}
  {%- else -%}
    {%- for part in m['content'] -%}
      {%- if part['type'] == 'image' -%}{{ '<start_of_image>' }}
      {%- elif part['type'] == 'text' -%}{{ part['text'] | trim }}{%- endif -%}
    {%- endfor -%}
  {%- endif -%}
  {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"""

CHATML_TEMPLATE = _TOOLS_BLOCK + """
{%- set ns = namespace(sys_done=false) -%}
{%- for m in messages -%}
  {%- if m['role'] == 'system' and loop.first -%}
    {{ '<|im_start|>system\\n' + m['content'] + ('\\n\\n' + tools_text if tools_text else '') + '<|im_end|>\\n' }}
    {%- set ns.sys_done = true -%}
  {%- else -%}
    {%- if loop.first and tools_text -%}{{ '<|im_start|>system\\n' + tools_text + '<|im_end|>\\n' }}{%- endif -%}
    {{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"""

LLAMA3_TEMPLATE = _TOOLS_BLOCK + """{{ bos_token }}
{%- for m in messages -%}
  {%- if loop.first and tools_text and m['role'] != 'system' -%}
    {{ '<|start_header_id|>system<|end_header_id|>\\n\\n' + tools_text + '<|eot_id|>' }}
  {%- endif -%}
  {%- set extra = ('\\n\\n' + tools_text) if (loop.first and tools_text and m['role'] == 'system') else '' -%}
  {{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + (m['content'] | trim) + extra + '<|eot_id|>' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif -%}"""


FALLBACKS = {"gemma": GEMMA_TEMPLATE, "llama3": LLAMA3_TEMPLATE, "chatml": CHATML_TEMPLATE}


def fallback_name(has_token: Callable[[str], bool]) -> str:
    """The built-in template (a FALLBACKS key) that fits a vocabulary."""
    if has_token("<start_of_turn>"):
        return "gemma"
    if has_token("<|start_header_id|>"):
        return "llama3"
    return "chatml"


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # transformers' tojson: no HTML escaping, unicode kept as is
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}` (transformers marks assistant tokens with it): the
    body is rendered as is; we have no use for the marks."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols, _GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateError as exc:
        raise EngineError(f"chat template does not compile: {exc}") from exc


def render_chat(source: str, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                tools: list[dict[str, Any]] | None = None, documents: list[dict[str, Any]] | None = None,
                special: dict[str, str | None] | None = None, **extra: Any) -> str:
    """Render `messages` (dicts with role/content) as transformers' apply_chat_template does."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise EngineError("chat messages must be a list of {'role': ..., 'content': ...} dicts")
    context: dict[str, Any] = {"bos_token": "", "eos_token": "", **(special or {})}
    context.update(extra)
    try:
        return compile_template(source).render(messages=messages, tools=tools, documents=documents,
                                               add_generation_prompt=add_generation_prompt, **context)
    except jinja2.TemplateError as exc:
        raise EngineError(f"chat template: {exc}") from exc
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:  # the template's own
        raise EngineError(f"chat template cannot render these messages ({type(exc).__name__}: {exc})") from exc
