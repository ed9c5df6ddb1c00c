"""A tokenizer's vocabulary as a grammar library sees it: the bytes each token stands for.

Control and unknown tokens, and the stop ids, carry no text (b""): a grammar never allows them, except
a stop id once the grammar is complete. User-defined tokens (Qwen's `<tool_call>`, Gemma's newline runs)
are text like any other: they spell their bytes, so a literal "<tool_call>" may be produced by that one
token as the model prefers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.tokenizer.vocab import CONTROL, UNKNOWN


@dataclass(frozen=True)
class GrammarVocab:
    pieces: list[bytes]  # token id -> bytes; b"" for special tokens
    special: frozenset[int]  # ids that never appear in grammar-constrained text
    eos_ids: tuple[int, ...]  # allowed once the grammar is complete (may be empty: a byte vocabulary)

    @property
    def size(self) -> int:
        return len(self.pieces)


def grammar_vocab(tok: Any, vocab_size: int | None = None) -> GrammarVocab:
    """The GrammarVocab of an engine tokenizer (GGUFTokenizer or ByteTokenizer). `vocab_size` pads the
    table with empty (never allowed) tokens when the model's logits are wider than the vocabulary."""
    n = int(tok.vocab_size)
    eos = tuple(int(i) for i in getattr(tok, "eos_ids", ()) or ())
    types = getattr(tok, "types", None)
    special = set(eos)
    if types is not None:
        special.update(i for i, ty in enumerate(types) if ty in (CONTROL, UNKNOWN))
    pieces = [b"" if i in special else bytes(tok.token_bytes(i)) for i in range(n)]
    if vocab_size is not None and vocab_size > n:
        special.update(range(n, vocab_size))
        pieces += [b""] * (vocab_size - n)
    return GrammarVocab(pieces, frozenset(special), eos)
