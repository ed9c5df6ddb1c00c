"""Model identity: a digest naming the tensor layout and the tokenizer a KV cache was computed with.

Two processes may only exchange KV blocks when they run the same model: the same tensors (names,
shapes, quant types: a Q4_K and a Q8_0 build of one checkpoint give different K/V) and the same
tokenizer (block hashes are over token ids). The digest is over that layout, not over the weight
bytes: hashing 250 MB-7 GB of weights at boot would cost seconds, and a file whose layout and
tokenizer match but whose bytes differ is a rebuilt copy of the same model in practice.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import numpy as np

from engine.gguf.config import ModelConfig
from engine.gguf.reader import GGUFFile

IDENTITY_BYTES = 32
# metadata keys that decide how text becomes token ids (and back)
_TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                   "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                   "tokenizer.ggml.add_bos_token")


def _feed(h: Any, key: str, value: Any) -> None:
    """Length-prefixed key and value, so no two different inputs feed the same bytes."""
    if isinstance(value, np.ndarray):
        data = value.dtype.str.encode() + b":" + np.ascontiguousarray(value).tobytes()
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        data = "\0".join(value).encode("utf-8", errors="surrogatepass") + f"#{len(value)}".encode()
    else:
        data = json.dumps(value, sort_keys=True, default=str).encode()
    for part in (key.encode(), data):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)


def gguf_identity(g: GGUFFile) -> bytes:
    """Digest of a GGUF's tensor layout (sorted names, shapes, types) and its tokenizer metadata."""
    h = hashlib.blake2b(digest_size=IDENTITY_BYTES, person=b"fak-model-id")
    for name in sorted(g.tensors):
        t = g.tensors[name]
        _feed(h, "tensor", [name, list(t.shape), t.qtype.name])
    for key in _TOKENIZER_KEYS:
        if key in g.metadata:
            _feed(h, key, g.metadata[key])
    return h.digest()


def config_identity(config: ModelConfig, name: str) -> bytes:
    """Digest for a model without a file (the synthetic checkpoint): its config and a name that says
    which weights (e.g. the seed), since there is no tensor table or tokenizer to hash."""
    h = hashlib.blake2b(digest_size=IDENTITY_BYTES, person=b"fak-model-id")
    _feed(h, "config", dataclasses.asdict(config))
    _feed(h, "name", name)
    return h.digest()
