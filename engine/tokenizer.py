"""The tokenizer embedded in a GGUF, as one object: encode, decode, stream, chat template.

    tok = engine.load_tokenizer("gemma3-270m")          # alias or path; "byte" -> ByteTokenizer
    ids = tok.encode("Hello")                            # [bos, ...] when the model adds BOS
    prompt_ids = tok.encode_chat([{"role": "user", "content": "Hi"}])
    s = tok.stream(); pieces = [s.push(i) for i in new_ids] + [s.flush()]
    tok.eos_ids                                          # stop ids: EOS + end-of-turn tokens

The first load of a GGUF builds a `tokenizers.Tokenizer` (engine/tokenizer_build.py) and stores
its tokenizer.json under `cache_dir()/tokenizers/`, keyed by the file's size, mtime and a hash
of its first MiBs, next to what later loads actually read (faster than parsing tokenizer.json):
a sidecar (token texts and types, special ids, template) and the merges as id pairs.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tokenizers import Tokenizer

from engine.aliases import cache_dir, resolve_model
from engine.chat_template import CHATML_TEMPLATE, fallback_template, render_chat
from engine.detok import StreamDecoder, decode_bytes, join_bytes
from engine.errors import EngineError, GGUFError
from engine.tokenizer_build import ADD_BOS_PRE, SPIECE_SPACE, TokenizerPlan, assemble, plan_tokenizer
from engine.tokenizer_gguf import BYTE, CONTROL, UNKNOWN, USER_DEFINED, VocabMeta, read_vocab

BUILD_VERSION = 1          # bump when the builder changes: old cache entries are then ignored
_HASH_BYTES = 4 << 20      # the header hash covers the first 4 MiB (magic, metadata, vocab start)

# llama.cpp's end-of-generation tokens, found by text (llama-vocab.cpp, special_eog_ids)
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
    "<|end_of_text|>", "<end_of_utterance>", "</s>", "<eos>",
})


class TextTokenizer(Protocol):
    """What the engine needs from a tokenizer (GGUFTokenizer and ByteTokenizer both provide it)."""

    bos_id: int | None
    eos_ids: tuple[int, ...]
    vocab_size: int

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]: ...
    def decode(self, ids: list[int], skip_special: bool = False) -> str: ...
    def stream(self, skip_special: bool = False) -> StreamDecoder: ...
    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None, **extra: Any) -> str: ...
    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None, **extra: Any) -> list[int]: ...
    def token_text(self, token_id: int) -> str: ...


@dataclass
class VocabInfo:
    """The sidecar stored next to the cached tokenizer.json (everything but scores and merges)."""

    model: str
    pre: str
    arch: str
    tokens: list[str]
    types: list[int]
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    eot_id: int | None
    eom_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    chat_template: str | None

    @classmethod
    def from_meta(cls, m: VocabMeta) -> "VocabInfo":
        # llama.cpp defaults: SPM adds BOS; BPE only for a few pre-tokenizers (Llama 3 ...).
        add_bos = m.add_bos if m.add_bos is not None else (m.model == "llama" or m.pre in ADD_BOS_PRE)
        return cls(model=m.model, pre=m.pre, arch=m.arch, tokens=m.tokens, types=m.types,
                   bos_id=m.bos_id, eos_id=m.eos_id, unk_id=m.unk_id, pad_id=m.pad_id, eot_id=m.eot_id,
                   eom_id=m.eom_id, add_bos=bool(add_bos and m.bos_id is not None),
                   add_eos=bool(m.add_eos and m.eos_id is not None),
                   add_space_prefix=m.add_space_prefix and m.model == "llama",
                   chat_template=m.chat_template)


def _byte_decoder() -> dict[int, int]:
    """GPT-2's byte alphabet reversed: code point of the printable stand-in -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in out:
            out[256 + extra] = b
            extra += 1
    return out


class GGUFTokenizer:
    """A GGUF's tokenizer: HF `tokenizers` for encoding, per-token byte table for decoding."""

    def __init__(self, hf: Tokenizer, info: VocabInfo, source: str = "") -> None:
        self.hf = hf
        self.info = info
        self.source = source
        self._lock = threading.Lock()  # encode_special_tokens is a switch on the shared Rust object
        self.vocab_size = len(info.tokens)
        self.bos_id = info.bos_id
        self.eos_ids = self._stop_ids()
        self.chat_template = info.chat_template or fallback_template(self.has_token)

    def _stop_ids(self) -> tuple[int, ...]:
        first = [i for i in (self.info.eos_id, self.info.eot_id, self.info.eom_id) if i is not None]
        # by text like llama.cpp, but only control tokens: Gemma's "</s>" is an HTML tag
        by_text = [i for i in map(self.token_id, sorted(EOG_TEXTS))
                   if i is not None and self.info.types[i] == CONTROL]
        return tuple(dict.fromkeys(first + sorted(by_text)))

    def token_id(self, text: str) -> int | None:
        """The id of a token by its text (None if absent)."""
        i = self.hf.token_to_id(text)
        return i if i is not None and self.info.tokens[i] == text else None

    def has_token(self, text: str) -> bool:
        return self.token_id(text) is not None

    def token_text(self, token_id: int) -> str:
        """The token as the GGUF spells it (U+2581 for spaces in SPM, byte alphabet in BPE)."""
        return self.info.tokens[token_id]

    # -- encoding -------------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`. `add_special` adds BOS/EOS as the model wants (add_bos/add_eos);
        `parse_special` lets control tokens written in the text (e.g. "<start_of_turn>") match."""
        with self._lock:
            self.hf.encode_special_tokens = not parse_special
            ids = self.hf.encode(text, add_special_tokens=False).ids
        if add_special:
            if self.info.add_bos and self.bos_id is not None:
                ids.insert(0, self.bos_id)
            if self.info.add_eos and self.info.eos_id is not None:
                ids.append(self.info.eos_id)
        return ids

    # -- decoding -------------------------------------------------------------------------------
    @cached_property
    def _pieces(self) -> list[bytes]:
        tokens, types = self.info.tokens, self.info.types
        out: list[bytes] = []
        if self.info.model == "gpt2":
            table = {cp: chr(b) for cp, b in _byte_decoder().items()}
            for t, ty in zip(tokens, types):
                if ty in (CONTROL, USER_DEFINED, UNKNOWN):
                    out.append(t.encode("utf-8"))
                    continue
                try:
                    out.append(t.translate(table).encode("latin-1"))
                except UnicodeEncodeError:  # not in the byte alphabet: stored as plain text
                    out.append(t.encode("utf-8"))
        else:
            for t, ty in zip(tokens, types):
                if ty == BYTE and len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                    out.append(bytes([int(t[3:5], 16)]))
                else:
                    out.append(t.replace(SPIECE_SPACE, " ").encode("utf-8"))
        return out

    @cached_property
    def _special_ids(self) -> frozenset[int]:
        return frozenset(i for i, ty in enumerate(self.info.types) if ty in (CONTROL, UNKNOWN))

    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < self.vocab_size:
            raise EngineError(f"token id {token_id} out of range (vocab size {self.vocab_size})")
        return self._pieces[token_id]

    def _piece_fn(self, skip_special: bool):
        pieces, special = self._pieces, self._special_ids
        n = self.vocab_size

        def piece(i: int) -> bytes:
            if not 0 <= i < n:
                raise EngineError(f"token id {i} out of range (vocab size {n})")
            return b"" if skip_special and i in special else pieces[i]
        return piece

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        """Text of `ids`; control tokens are written out unless `skip_special`."""
        return decode_bytes(join_bytes(self._piece_fn(skip_special), ids), self.info.add_space_prefix)

    def stream(self, skip_special: bool = False) -> StreamDecoder:
        """An incremental decoder: `.push(id) -> str`, `.flush() -> str`; pieces join to decode()."""
        return StreamDecoder(self._piece_fn(skip_special), self.info.add_space_prefix)

    # -- chat -----------------------------------------------------------------------------------
    def _special_text(self) -> dict[str, str | None]:
        def text(i: int | None) -> str | None:
            return None if i is None else self.info.tokens[i]
        return {"bos_token": text(self.bos_id) or "", "eos_token": text(self.info.eos_id) or "",
                "unk_token": text(self.info.unk_id), "pad_token": text(self.info.pad_id)}

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None, **extra: Any) -> str:
        """The prompt text (it may start with the BOS token's text, as HF templates do)."""
        return render_chat(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                           tools=tools, special=self._special_text(), **extra)

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None, **extra: Any) -> list[int]:
        """Render then encode with special tokens parsed; BOS added once if the template did not."""
        text = self.apply_chat_template(messages, add_generation_prompt, tools, **extra)
        ids = self.encode(text, add_special=False, parse_special=True)
        if self.info.add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids.insert(0, self.bos_id)
        return ids


class ByteTokenizer:
    """One token per UTF-8 byte (vocab 256) for the synthetic model.

    No special tokens: nothing is added by `encode`, `bos_id` is None and `eos_ids` is empty
    (generation stops on max tokens). Chat prompts use the ChatML layout as plain text.
    """

    vocab_size = 256
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    chat_template = CHATML_TEMPLATE

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def _piece(self, i: int) -> bytes:
        if not 0 <= i < 256:
            raise EngineError(f"token id {i} out of range (byte vocabulary of 256)")
        return bytes((i,))

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return decode_bytes(join_bytes(self._piece, ids))

    def stream(self, skip_special: bool = False) -> StreamDecoder:
        return StreamDecoder(self._piece)

    def token_text(self, token_id: int) -> str:
        return self._piece(token_id).decode("latin-1")

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None, **extra: Any) -> str:
        return render_chat(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                           tools=tools, **extra)

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None, **extra: Any) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, tools, **extra))


# -- loading and the on-disk cache ----------------------------------------------------------------
def gguf_identity(path: Path) -> str:
    """Cache key: builder version, size, mtime and a hash of the first MiBs of the file."""
    st = path.stat()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(_HASH_BYTES))
    return hashlib.sha256(f"{BUILD_VERSION}|{st.st_size}|{st.st_mtime_ns}|{h.hexdigest()}".encode()).hexdigest()[:32]


def tokenizer_cache_dir() -> Path:
    """$FAK_TOKENIZER_CACHE, else cache_dir()/tokenizers."""
    env = os.environ.get("FAK_TOKENIZER_CACHE")
    return Path(env) if env else cache_dir() / "tokenizers"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}.{threading.get_ident()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _cache_paths(key: str) -> tuple[Path, Path, Path]:
    d = tokenizer_cache_dir()
    return d / f"{key}.tokenizer.json", d / f"{key}.meta.json", d / f"{key}.merges.npy"


def _load_cached(key: str) -> tuple[Tokenizer, VocabInfo] | None:
    _, meta_path, merges_path = _cache_paths(key)
    if not (meta_path.exists() and merges_path.exists()):
        return None
    try:
        doc = json.loads(meta_path.read_text(encoding="utf-8"))
        info = VocabInfo(**doc["info"])
        p = doc["plan"]
        plan = TokenizerPlan(kind=p["kind"], pre=p["pre"],
                             respelled={int(k): v for k, v in p["respelled"].items()},
                             merges=np.load(merges_path), added=[(int(i), bool(s)) for i, s in p["added"]],
                             unk_id=p["unk_id"], add_space_prefix=p["add_space_prefix"])
        return assemble(plan, info.tokens), info
    except Exception:  # a damaged or foreign cache entry: rebuild it
        return None


def _save_cache(key: str, hf: Tokenizer, info: VocabInfo, plan: TokenizerPlan) -> None:
    """tokenizer.json (the portable artifact, loadable by any HF tokenizers user) plus what our
    own warm load reads: the vocabulary sidecar and the merges as token-id pairs."""
    json_path, meta_path, merges_path = _cache_paths(key)
    small = {"kind": plan.kind, "pre": plan.pre, "respelled": {str(k): v for k, v in plan.respelled.items()},
             "added": plan.added, "unk_id": plan.unk_id, "add_space_prefix": plan.add_space_prefix}
    try:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(json_path, hf.to_str())
        tmp = merges_path.with_name(f"{merges_path.stem}.tmp{os.getpid()}.{threading.get_ident()}.npy")
        try:
            np.save(tmp, plan.merges)
            os.replace(tmp, merges_path)
        finally:
            tmp.unlink(missing_ok=True)
        # the sidecar last: its presence marks a complete entry
        _atomic_write(meta_path, json.dumps({"info": asdict(info), "plan": small}, ensure_ascii=False))
    except OSError:
        pass  # a read-only cache dir only costs the next load a rebuild


_loaded: dict[tuple[str, str], GGUFTokenizer] = {}
_loaded_lock = threading.Lock()


def load_gguf_tokenizer(path: str | os.PathLike[str], use_cache: bool = True) -> GGUFTokenizer:
    path = Path(path)
    key = gguf_identity(path)
    memo = (str(path.resolve()), key)
    with _loaded_lock:
        if use_cache and memo in _loaded:
            return _loaded[memo]
    cached = _load_cached(key) if use_cache else None
    if cached is not None:
        hf, info = cached
    else:
        try:
            meta = read_vocab(path)
            plan = plan_tokenizer(meta)
        except GGUFError:
            raise  # already names the file
        except EngineError as exc:
            raise EngineError(f"{path}: {exc}") from exc
        hf = assemble(plan, meta.tokens)
        info = VocabInfo.from_meta(meta)
        if use_cache:
            _save_cache(key, hf, info, plan)
    tok = GGUFTokenizer(hf, info, source=str(path))
    if use_cache:
        with _loaded_lock:
            _loaded[memo] = tok
    return tok


def load_tokenizer(path_or_alias: str | os.PathLike[str] | None = None, use_cache: bool = True
                   ) -> GGUFTokenizer | ByteTokenizer:
    """The tokenizer of a GGUF (alias or path, see engine.aliases), or "byte" for ByteTokenizer."""
    if path_or_alias is not None and str(path_or_alias) == "byte":
        return ByteTokenizer()
    return load_gguf_tokenizer(resolve_model(path_or_alias), use_cache=use_cache)
