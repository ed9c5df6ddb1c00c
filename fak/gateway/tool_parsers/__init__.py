"""Tool-call parsers, one per model family (Hermes/Qwen, Llama 3 JSON, Mistral, generic JSON).

Exports: Text, Call, ToolParser, parser_for (picks the family), parse_all, and the parser classes.
"""

from fak.gateway.tool_parsers.base import Call, Event, Text, ToolParser, parse_all
from fak.gateway.tool_parsers.choose import family_for, parser_for
from fak.gateway.tool_parsers.generic import GenericParser
from fak.gateway.tool_parsers.hermes import HermesParser
from fak.gateway.tool_parsers.llama3 import Llama3JsonParser
from fak.gateway.tool_parsers.mistral import MistralParser

__all__ = ["Call", "Event", "GenericParser", "HermesParser", "Llama3JsonParser", "MistralParser", "Text",
           "ToolParser", "family_for", "parse_all", "parser_for"]
