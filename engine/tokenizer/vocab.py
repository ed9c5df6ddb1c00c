"""The tokenizer part of a GGUF's metadata (llama.cpp key names and defaults) as one VocabMeta.

The bytes are read by engine.gguf.reader.read_metadata: only the `tokenizer.` keys and the architecture,
no tensor table (~0.1 s for Gemma 3's 262k-token vocabulary).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import GGUFError
from engine.gguf.reader import read_metadata

TOKENIZER_KEYS = ("tokenizer.", "general.architecture")

# llama.cpp token types (tokenizer.ggml.token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


@dataclass
class VocabMeta:
    """Everything a tokenizer needs from a GGUF (llama.cpp key names, defaults as llama.cpp)."""

    model: str                      # tokenizer.ggml.model: "llama" (SPM) or "gpt2" (byte-level BPE)
    pre: str                        # tokenizer.ggml.pre ("default" when absent)
    arch: str                       # general.architecture
    tokens: list[str]
    types: list[int]                # one llama.cpp token type per token (NORMAL when absent)
    scores: np.ndarray | None = None
    merges: list[str] | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    unk_id: int | None = None
    pad_id: int | None = None
    eot_id: int | None = None
    eom_id: int | None = None
    add_bos: bool | None = None       # None: the file does not say (llama.cpp then decides by type)
    add_eos: bool | None = None
    add_space_prefix: bool = False
    chat_template: str | None = None


class NoTokenizer(GGUFError):
    """The GGUF carries weights only (no tokenizer.ggml.model): callers may fall back to bytes."""


def _opt_id(kv: dict[str, Any], key: str, n_tokens: int, path: str | Path) -> int | None:
    v = kv.get(key)
    if v is None:
        return None
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
        raise GGUFError(f"{path}: metadata key {key!r} must be a token id, got {v!r}")
    v = int(v)
    return v if 0 <= v < n_tokens else None


def _opt_bool(kv: dict[str, Any], key: str) -> bool | None:
    v = kv.get(key)
    return None if v is None else bool(v)


def _typed(kv: dict[str, Any], key: str, path: str | Path, ok: Callable[[Any], bool], want: str) -> Any:
    """kv[key] (None when absent), or one GGUFError naming the key when its value has the wrong type."""
    v = kv.get(key)
    if v is not None and not ok(v):
        raise GGUFError(f"{path}: metadata key {key!r} must be {want}, got {type(v).__name__}")
    return v


def _str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _num_array(v: Any) -> bool:
    return isinstance(v, np.ndarray) and v.dtype.kind in "iuf"


def read_vocab(path: str | Path) -> VocabMeta:
    """The tokenizer metadata of a GGUF, with llama.cpp's defaults for missing flags."""
    kv = read_metadata(path, TOKENIZER_KEYS)
    model = kv.get("tokenizer.ggml.model")
    if model is None:
        raise NoTokenizer(f"{path}: no tokenizer in this GGUF (tokenizer.ggml.model missing)")
    tokens = _typed(kv, "tokenizer.ggml.tokens", path, _str_list, "an array of strings")
    if not tokens:
        raise GGUFError(f"{path}: tokenizer.ggml.tokens missing or empty")
    n = len(tokens)
    types_arr = _typed(kv, "tokenizer.ggml.token_type", path, _num_array, "an array of integers")
    types = [int(t) for t in types_arr.tolist()] if types_arr is not None else [NORMAL] * n
    if len(types) < n:
        raise GGUFError(f"{path}: tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
    scores = _typed(kv, "tokenizer.ggml.scores", path, _num_array, "an array of numbers")
    if scores is not None:
        scores = np.asarray(scores, dtype=np.float32)
        if len(scores) < n:
            raise GGUFError(f"{path}: tokenizer.ggml.scores has {len(scores)} entries for {n} tokens")
    is_spm = model == "llama"
    # llama.cpp: SPM puts a space in front of the text unless told otherwise; BPE does not.
    meta = VocabMeta(
        model=str(model),
        pre=str(kv.get("tokenizer.ggml.pre") or "default"),
        arch=str(kv.get("general.architecture") or ""),
        tokens=tokens,
        types=types[:n],
        scores=scores,
        merges=_typed(kv, "tokenizer.ggml.merges", path, _str_list, "an array of strings"),
        bos_id=_opt_id(kv, "tokenizer.ggml.bos_token_id", n, path),
        eos_id=_opt_id(kv, "tokenizer.ggml.eos_token_id", n, path),
        unk_id=_opt_id(kv, "tokenizer.ggml.unknown_token_id", n, path),
        pad_id=_opt_id(kv, "tokenizer.ggml.padding_token_id", n, path),
        eot_id=_opt_id(kv, "tokenizer.ggml.eot_token_id", n, path),
        eom_id=_opt_id(kv, "tokenizer.ggml.eom_token_id", n, path),
        add_bos=_opt_bool(kv, "tokenizer.ggml.add_bos_token"),
        add_eos=_opt_bool(kv, "tokenizer.ggml.add_eos_token"),
        add_space_prefix=bool(kv.get("tokenizer.ggml.add_space_prefix", is_spm)),
        chat_template=_typed(kv, "tokenizer.chat_template", path, lambda v: isinstance(v, str), "a string"),
    )
    if is_spm and meta.unk_id is None and n > 0:
        meta.unk_id = 0 if tokens[0] == "<unk>" else None
    return meta
