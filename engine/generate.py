"""One-shot generation on a Session: prefill, then sample/step until max_tokens or a stop id.

The single-stream path of `fak run MODEL PROMPT` (and the solo reference in scheduler tests); the
`inkernel` engine serves through engine.scheduler instead. `codec_for` picks the text codec for a
model (both use it): the GGUF tokenizer, or the ByteTokenizer for the synthetic model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from engine.errors import EngineError
from engine.model import Model
from engine.sampling import Sampler, SamplingParams
from engine.session import Session


@dataclass
class GenStats:
    prompt_tokens: int = 0
    generated: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0  # time inside step() calls only (not the consumer's printing)
    steps: int = 0
    stop_reason: str = "length"

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.steps / self.decode_s if self.decode_s > 0 else 0.0


@dataclass
class Generation:
    """Iterate to get token ids as they are sampled; `stats` fills in as it runs."""

    model: Model
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams = field(default_factory=SamplingParams)
    stop_ids: Sequence[int] = ()
    stats: GenStats = field(default_factory=GenStats)

    def __iter__(self) -> Iterator[int]:
        if not self.prompt_ids:
            raise EngineError("empty prompt (no token ids)")
        if len(self.prompt_ids) + self.max_tokens > self.model.config.context_length:
            raise EngineError(f"prompt of {len(self.prompt_ids)} + {self.max_tokens} tokens exceeds the context "
                              f"length {self.model.config.context_length}")
        sampler = Sampler(self.params)
        session = Session(self.model)
        try:
            t0 = time.perf_counter()
            logits = session.prefill(self.prompt_ids)
            self.stats.prefill_s = time.perf_counter() - t0
            self.stats.prompt_tokens = len(self.prompt_ids)
            for i in range(self.max_tokens):
                tok = sampler(logits)
                if tok in self.stop_ids:
                    self.stats.stop_reason = "stop"
                    break
                self.stats.generated += 1
                yield tok
                if i + 1 < self.max_tokens:
                    t1 = time.perf_counter()
                    logits = session.step(tok)
                    self.stats.decode_s += time.perf_counter() - t1
                    self.stats.steps += 1
        finally:
            session.free()


def codec_for(model: Model, path: Any = None, bytes_fallback: bool = False) -> Any:
    """The model's tokenizer: the ByteTokenizer for the synthetic model, and with `bytes_fallback` also
    for a GGUF without a vocabulary (a broken vocabulary is still an error)."""
    from engine.tokenizer import ByteTokenizer, load_tokenizer
    from engine.tokenizer_gguf import NoTokenizer

    if model.name == "synthetic":
        return ByteTokenizer()
    try:
        return load_tokenizer(str(path) if path is not None else None)
    except NoTokenizer:
        if not bytes_fallback:
            raise
        return ByteTokenizer()
