"""One-shot generation on a Session: prefill, then sample/step until max_tokens or a stop id.

Shared by `fak run MODEL PROMPT` and the `inkernel` engine. Also picks the text codec for a
model: the GGUF tokenizer (engine.tokenizer, when installed) or bytes for the synthetic model.
"""

from __future__ import annotations

import codecs
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


class ByteCodec:
    """Text <-> ids for byte-level models (the synthetic checkpoint): one id per UTF-8 byte."""

    bos_id = None
    eos_ids: tuple[int, ...] = ()
    vocab_size = 256

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def stream(self, skip_special: bool = False) -> "_ByteStream":
        return _ByteStream()


class _ByteStream:
    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._dec.decode(bytes([token_id]))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


def codec_for(model: Model, path: Any = None) -> Any | None:
    """The model's tokenizer, ByteCodec for the synthetic model, or None when no tokenizer is installed."""
    if model.name == "synthetic":
        return ByteCodec()
    try:
        from engine.tokenizer import load_tokenizer
    except ImportError:
        return None
    return load_tokenizer(str(path) if path is not None else None)
