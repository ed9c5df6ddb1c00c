"""What every engine facade shares about work run on its own thread: finishing queued callables' futures, and
the grammar compiler of its tokenizer. NativeScheduler (its loop thread) and PDHead (its calls thread) both use it,
so the two behave alike."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

from engine.errors import EngineError
from engine.grammar import GrammarCompiler, compiler_for


def run_calls(calls: Iterable[tuple[Callable[[], Any], Future[Any]]]) -> None:
    """Run each fn() and set its future (an exception goes to the caller, the owner thread goes on); a
    future cancelled before it ran is skipped."""
    for fn, fut in calls:
        if fut.set_running_or_notify_cancel():
            try:
                fut.set_result(fn())
            except BaseException as e:
                fut.set_exception(e)


class GrammarHost:
    """grammar_compiler()/warm_grammar() over `self.tokenizer`, `self.eos_ids` and `_grammar_vocab()`."""

    tokenizer: Any
    eos_ids: Iterable[int]
    _grammar_hint = ""  # said after "a grammar needs a tokenizer"

    def _grammar_vocab(self) -> int:
        raise NotImplementedError

    def grammar_compiler(self) -> GrammarCompiler:
        """The compiler of this engine's tokenizer (shared by engines over the same tokenizer)."""
        if self.tokenizer is None:
            raise EngineError("a grammar needs a tokenizer" + self._grammar_hint)
        return compiler_for(self.tokenizer, self._grammar_vocab(), tuple(sorted(self.eos_ids)))

    def warm_grammar(self) -> None:
        """Build the tokenizer's grammar tables now (~3 s for a 262k vocabulary, holding the GIL), instead
        of on the first constrained admit(). Idempotent."""
        self.grammar_compiler().warm()
