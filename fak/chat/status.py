"""The dim line after each reply: how much of the prompt the KV cache already held, what was new."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TurnStats:
    prompt: int = 0  # prompt tokens of the last model call
    cached: int = 0  # of them, read from the prefix cache
    generated: int = 0  # completion tokens, summed over the turn's model calls
    decode_s: float = 0.0  # first token to last, summed
    calls: int = 0  # model calls in the turn (one more per round of tool results)

    @property
    def prefilled(self) -> int:
        return self.prompt - self.cached

    @property
    def rate(self) -> float:
        """Decode speed: the tokens after each call's first over the time they took."""
        n = self.generated - self.calls
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    def line(self, context: int | None) -> str:
        ctx = f"{self.prompt + self.generated}/{context}" if context else f"{self.prompt + self.generated}"
        return (f"reused {self.cached}/{self.prompt} prompt tokens · {self.prefilled} prefilled · "
                f"{self.generated} generated · {self.rate:.1f} tok/s · context {ctx}")
