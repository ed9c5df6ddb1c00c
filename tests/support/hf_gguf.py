"""transformers reading a GGUF (the oracle side), without paying for gguf-py's reader twice over.

`from_pretrained(..., gguf_file=)` builds a `gguf.GGUFReader` once for the config and again for the tensors,
and the reader walks every metadata value through `np.memmap.__getitem__`: for a 262k-token vocabulary that
is ~12 million memmap slices, ~45 s of a test run per model on a Zen 2 host. Inside `fast_reader()` one
reader per path is kept for the duration, and it reads through a plain ndarray view of the same mapping
(same bytes, no subclass hooks), so a Gemma 3 load takes ~20 s. Nothing transformers computes changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np


class _PlainReader(gguf.GGUFReader):
    """A GGUFReader whose `data` is an ndarray view of its memmap: slicing it skips memmap's
    `__array_finalize__`, which is most of the reader's time on a large vocabulary."""

    @property  # type: ignore[override]
    def data(self) -> np.ndarray:
        return self._plain

    @data.setter
    def data(self, mapped: np.ndarray) -> None:
        self._plain = mapped.view(np.ndarray)


@contextlib.contextmanager
def fast_reader() -> Iterator[None]:
    """transformers imports `GGUFReader` from `gguf` at each call, so swapping the module attribute for the
    duration is enough; the original is put back even if the load fails."""
    readers: dict[tuple[str, str], gguf.GGUFReader] = {}

    def reader(path: Any, mode: str = "r") -> gguf.GGUFReader:
        key = (str(path), mode)
        if key not in readers:
            readers[key] = _PlainReader(path, mode)
        return readers[key]

    original = gguf.GGUFReader
    gguf.GGUFReader = reader  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        gguf.GGUFReader = original  # type: ignore[misc]


def causal_lm(path: Path, **kwargs: Any) -> Any:
    """HF's float32 model for a GGUF file, in eval mode."""
    import torch
    import transformers

    with fast_reader():
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                  dtype=torch.float32, **kwargs)
    return model.eval()


def tokenizer(path: Path) -> Any:
    """HF's tokenizer for a GGUF file."""
    from transformers import AutoTokenizer

    with fast_reader():
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
