"""On-disk cache of built tokenizers, under `cache_dir()/tokenizers/` ($FAK_TOKENIZER_CACHE).

One entry per GGUF identity (builder version, file size, mtime, SHA-256 of the first 4 MiB):

    <key>.tokenizer.json   the built HF tokenizer: portable, loadable by any `tokenizers` user
    <key>.meta.json        small: special ids, flags, template, stop ids (read on the load path)
    <key>.vocab.json       token texts and types, added tokens, respellings
    <key>.merges.npy       merges as (n, 2) int32 token ids, best first

Our own warm load does not parse tokenizer.json: `tokenizers` deserializes a 262k-token BPE from
JSON ~4x slower than it builds the same model from Python lists, so we keep those lists instead.
The meta file is written last; its presence marks a complete entry. Writes go through a
temporary name and `os.replace`, so a crash or a concurrent writer never leaves a torn file.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from engine.gguf.aliases import cache_dir
from engine.tokenizer.build import TokenizerPlan

BUILD_VERSION = 2          # bump when the builder changes: old cache entries are then ignored
_HASH_BYTES = 4 << 20      # the header hash covers the first 4 MiB (magic, metadata, vocab start)


def gguf_identity(path: Path) -> str:
    st = path.stat()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(_HASH_BYTES))
    ident = f"{BUILD_VERSION}|{st.st_size}|{st.st_mtime_ns}|{h.hexdigest()}"
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def tokenizer_cache_dir() -> Path:
    env = os.environ.get("FAK_TOKENIZER_CACHE")
    return Path(env) if env else cache_dir() / "tokenizers"


def entry_paths(key: str) -> dict[str, Path]:
    d = tokenizer_cache_dir()
    return {part: d / f"{key}.{part}" for part in ("tokenizer.json", "meta.json", "vocab.json", "merges.npy")}


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_ident()}")


def _write_text(path: Path, text: str) -> None:
    tmp = _tmp_name(path)
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _write_npy(path: Path, arr: np.ndarray) -> None:
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            np.save(f, arr)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_entry(key: str, hf: Tokenizer, meta: dict[str, Any], tokens: list[str], types: list[int],
               plan: TokenizerPlan) -> None:
    """Store an entry; an unwritable cache dir only costs the next load a rebuild."""
    p = entry_paths(key)
    vocab = {"tokens": tokens, "types": types, "added": plan.added,
             "respelled": {str(k): v for k, v in plan.respelled.items()}}
    plan_small = {"kind": plan.kind, "pre": plan.pre, "unk_id": plan.unk_id,
                  "add_space_prefix": plan.add_space_prefix}
    try:
        p["meta.json"].parent.mkdir(parents=True, exist_ok=True)
        _write_text(p["tokenizer.json"], hf.to_str())
        _write_npy(p["merges.npy"], plan.merges)
        _write_text(p["vocab.json"], json.dumps(vocab, ensure_ascii=False))
        _write_text(p["meta.json"], json.dumps({"info": meta, "plan": plan_small}, ensure_ascii=False))
    except OSError:
        pass


def load_meta(key: str) -> dict[str, Any] | None:
    """The small part of an entry (None when absent or unreadable)."""
    try:
        doc = json.loads(entry_paths(key)["meta.json"].read_text(encoding="utf-8"))
        return doc if isinstance(doc, dict) and "info" in doc and "plan" in doc else None
    except (OSError, ValueError):
        return None


def load_vocab_and_plan(key: str, doc: dict[str, Any]) -> tuple[list[str], list[int], TokenizerPlan]:
    """The large part of an entry (raises on a damaged entry)."""
    p = entry_paths(key)
    vocab = json.loads(p["vocab.json"].read_text(encoding="utf-8"))
    small = doc["plan"]
    plan = TokenizerPlan(kind=small["kind"], pre=small["pre"],
                         respelled={int(k): v for k, v in vocab["respelled"].items()},
                         merges=np.load(p["merges.npy"]),
                         added=[(int(i), bool(s)) for i, s in vocab["added"]],
                         unk_id=small["unk_id"], add_space_prefix=small["add_space_prefix"])
    return vocab["tokens"], vocab["types"], plan
