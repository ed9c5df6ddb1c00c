"""Constrained decoding: GrammarSpec (what an output must match), compiled once per tokenizer and spec
(llguidance), and a Matcher per lane that masks a logits row. Exports: GrammarSpec, GrammarCompiler,
compiler_for, Matcher.
"""

from engine.grammar.compile import GrammarCompiler, compiler_for
from engine.grammar.matcher import Matcher
from engine.grammar.spec import GrammarSpec

__all__ = ["GrammarCompiler", "GrammarSpec", "Matcher", "compiler_for"]
