"""Which parser a model gets: from its chat template, else its vocabulary, else its architecture."""

from __future__ import annotations

from collections.abc import Callable

from fak.gateway.tool_parsers.base import ToolParser
from fak.gateway.tool_parsers.generic import GenericParser
from fak.gateway.tool_parsers.hermes import HermesParser
from fak.gateway.tool_parsers.llama3 import Llama3JsonParser
from fak.gateway.tool_parsers.mistral import MistralParser

# what a chat template that renders tools writes for its family (checked in this order)
_BY_TEMPLATE: tuple[tuple[tuple[str, ...], type], ...] = (
    (("<tool_call>",), HermesParser),
    (("[TOOL_CALLS]",), MistralParser),
    (("<|python_tag|>", '"parameters"'), Llama3JsonParser),
)
# the family's marker as a vocabulary token
_BY_TOKEN = (("<tool_call>", HermesParser), ("[TOOL_CALLS]", MistralParser), ("<|python_tag|>", Llama3JsonParser))
# GGUF general.architecture values whose instruct models all use one family ("llama" does not:
# Llama 3 and Mistral GGUFs both say llama)
_BY_ARCH = {"qwen2": HermesParser, "qwen2moe": HermesParser, "qwen3": HermesParser, "qwen3moe": HermesParser}


def family_for(chat_template: str | None, model_arch: str | None = None,
               vocab_has: Callable[[str], bool] | None = None) -> type:
    """The parser class for a model (GenericParser when nothing says otherwise)."""
    if chat_template:
        for needles, cls in _BY_TEMPLATE:
            if any(n in chat_template for n in needles):
                return cls
    if vocab_has is not None:
        for token, cls in _BY_TOKEN:
            if vocab_has(token):
                return cls
    return _BY_ARCH.get((model_arch or "").lower(), GenericParser)


def parser_for(chat_template: str | None, model_arch: str | None = None,
               vocab_has: Callable[[str], bool] | None = None) -> ToolParser:
    """A fresh parser (one per response) for the model's tool-call family."""
    parser: ToolParser = family_for(chat_template, model_arch, vocab_has)()
    return parser
