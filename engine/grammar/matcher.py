"""Matcher: one constrained lane's grammar state. Before a token is sampled, `mask(row)` writes -inf
over every token the grammar does not allow next (in place); after, `advance(token)` moves the state.

Owned by the scheduler's loop thread (like the Lane that holds it). The mask is llguidance's 32-bit
bitmask, filled by its Rust matcher (the GIL is released while it runs) and applied by
engine/kernels/bitmask.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import EngineError
from engine.kernels.bitmask import mask_logits


class Matcher:
    def __init__(self, matcher: Any, mask_tokens: int) -> None:
        self._m = matcher  # llguidance.LLMatcher
        self.words = np.zeros((mask_tokens + 31) // 32, dtype=np.int32)  # reused: filled before each token

    def mask(self, row: np.ndarray) -> int:
        """-inf (in place) on every logit the grammar forbids next; returns how many stay allowed."""
        w = self.words
        self._m.unsafe_compute_mask_ptr(w.ctypes.data, w.nbytes)
        return mask_logits(row, w)

    def advance(self, token: int) -> None:
        """Feed the sampled token; a token the mask did not allow is an engine bug and raises."""
        if not self._m.consume_token(int(token)):
            raise EngineError(f"grammar rejected token {token}: {self._m.get_error()}")

    @property
    def done(self) -> bool:
        """The grammar is complete and nothing may follow (the lane finishes with reason stop)."""
        return bool(self._m.is_stopped()) and not self._m.is_error()

    @property
    def accepting(self) -> bool:
        """The output so far is a complete match (more may still follow)."""
        return bool(self._m.is_accepting())

    @property
    def error(self) -> str:
        return str(self._m.get_error())
