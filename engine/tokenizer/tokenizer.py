"""The tokenizer embedded in a GGUF, as one object: encode, decode, stream, chat template.

    tok = engine.load_tokenizer("gemma3-270m")      # alias or path; "byte"/"synthetic" -> ByteTokenizer
    ids = tok.encode("Hello")                        # [bos, ...] when the model adds BOS
    prompt = tok.encode_chat([{"role": "user", "content": "Hi"}])   # template + encode, one BOS
    s = tok.stream(); text = "".join(s.push(i) for i in new_ids) + s.flush()
    tok.eos_ids                                      # stop ids: EOS, then end-of-turn tokens

The first load of a GGUF reads its metadata, builds a `tokenizers.Tokenizer`
(engine/tokenizer/build.py) and stores it (engine/tokenizer/cache.py). Later loads read the small
part of the cache entry and return at once; the vocabulary and the HF tokenizer are built from the
entry in a background thread (the Rust side runs mostly outside the GIL, so it overlaps with
loading the weights), and the first call that needs them waits for it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from tokenizers import Tokenizer

from engine.errors import EngineError, GGUFError
from engine.gguf.aliases import resolve_model
from engine.tokenizer import cache
from engine.tokenizer.build import ADD_BOS_PRE, SPIECE_SPACE, assemble, plan_tokenizer
from engine.tokenizer.chat_template import CHATML_TEMPLATE, FALLBACKS, fallback_name, render_chat
from engine.tokenizer.detok import StreamDecoder, decode_bytes, join_bytes
from engine.tokenizer.vocab import BYTE, CONTROL, UNKNOWN, USER_DEFINED, VocabMeta, read_vocab

# llama.cpp's end-of-generation tokens, found by text (llama-vocab.cpp, special_eog_ids)
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
             "<|end_of_text|>", "<end_of_utterance>", "</s>", "<eos>")


class TextTokenizer(Protocol):
    """What the engine needs from a tokenizer (GGUFTokenizer and ByteTokenizer both provide it)."""

    bos_id: int | None
    eos_ids: tuple[int, ...]
    vocab_size: int
    has_chat_template: bool

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
    """The small facts about a vocabulary (what a cache entry's meta.json holds)."""

    model: str                      # "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE)
    pre: str
    arch: str
    n_vocab: int
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    chat_template: str | None
    fallback: str                   # built-in template used when chat_template is None
    stop_ids: list[int]             # EOS, EOT/EOM, then control tokens named like llama.cpp's EOG
    special_text: dict[str, str | None] = field(default_factory=dict)  # bos_token, eos_token, ...

    @classmethod
    def from_meta(cls, m: VocabMeta) -> VocabInfo:
        first: dict[str, int] = {}
        for t in (*EOG_TEXTS, "<start_of_turn>", "<|start_header_id|>"):
            i = _find(m.tokens, t)
            if i is not None:
                first[t] = i
        # stop on control tokens only: Gemma's "</s>" is an HTML tag, not an end of text
        by_text = sorted(i for t, i in first.items() if t in EOG_TEXTS and m.types[i] == CONTROL)
        stop = [i for i in (m.eos_id, m.eot_id, m.eom_id) if i is not None] + by_text
        # llama.cpp defaults: SPM adds BOS; BPE only for a few pre-tokenizers (Llama 3 ...)
        add_bos = m.add_bos if m.add_bos is not None else (m.model == "llama" or m.pre in ADD_BOS_PRE)

        def text(i: int | None) -> str | None:
            return None if i is None else m.tokens[i]

        return cls(model=m.model, pre=m.pre, arch=m.arch, n_vocab=len(m.tokens), bos_id=m.bos_id,
                   eos_id=m.eos_id, unk_id=m.unk_id, pad_id=m.pad_id,
                   add_bos=bool(add_bos and m.bos_id is not None),
                   add_eos=bool(m.add_eos and m.eos_id is not None),
                   add_space_prefix=m.add_space_prefix and m.model == "llama",
                   chat_template=m.chat_template, fallback=fallback_name(first.__contains__),
                   stop_ids=list(dict.fromkeys(stop)),
                   special_text={"bos_token": text(m.bos_id) or "", "eos_token": text(m.eos_id) or "",
                                 "unk_token": text(m.unk_id), "pad_token": text(m.pad_id)})


def _find(tokens: list[str], text: str) -> int | None:
    try:
        return tokens.index(text)
    except ValueError:
        return None


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


Loaded = tuple[list[str], list[int], Tokenizer]   # token texts, token types, HF tokenizer


class _Pending:
    """A value built in a background thread; `get()` waits for it (and re-raises its error)."""

    def __init__(self, build: Callable[[], Loaded]) -> None:
        self._build = build
        self._value: Loaded | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fak-tokenizer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._build()
        except BaseException as exc:  # handed to the caller of get()
            self._error = exc

    def get(self) -> Loaded:
        self._thread.join()
        if self._error is not None:
            raise self._error
        if self._value is None:  # forked while building: the thread is gone in this process
            self._value = self._build()
        return self._value


class GGUFTokenizer:
    """A GGUF's tokenizer: HF `tokenizers` for encoding, a per-token byte table for decoding."""

    def __init__(self, info: VocabInfo, loaded: Loaded | _Pending, source: str = "") -> None:
        self.info = info
        self.source = source
        self._loaded = loaded
        self._lock = threading.Lock()  # encode_special_tokens is a switch on the shared Rust object
        self.vocab_size = info.n_vocab
        self.bos_id = info.bos_id
        self.eos_ids = tuple(info.stop_ids)
        self.chat_template = info.chat_template or FALLBACKS[info.fallback]

    @property
    def has_chat_template(self) -> bool:
        """The GGUF carries `tokenizer.chat_template` (a base model usually does not: then chat prompts
        fall back to a built-in layout, and completion tools should not apply one by default)."""
        return self.info.chat_template is not None

    @classmethod
    def from_meta(cls, meta: VocabMeta, source: str = "") -> GGUFTokenizer:
        hf = assemble(plan_tokenizer(meta), meta.tokens)
        return cls(VocabInfo.from_meta(meta), (meta.tokens, meta.types, hf), source)

    def _get(self) -> Loaded:
        loaded = self._loaded  # read once: another thread may swap it in between
        if isinstance(loaded, _Pending):
            loaded = loaded.get()
            self._loaded = loaded
        return loaded

    @property
    def hf(self) -> Tokenizer:
        return self._get()[2]

    @property
    def tokens(self) -> list[str]:
        return self._get()[0]

    @property
    def types(self) -> list[int]:
        return self._get()[1]

    def token_text(self, token_id: int) -> str:
        """The token as the GGUF spells it (U+2581 for spaces in SPM, byte alphabet in BPE)."""
        return self.tokens[token_id]

    def token_id(self, text: str) -> int | None:
        """The id of a token by its GGUF spelling (None if absent)."""
        i = self.hf.token_to_id(text)
        return i if i is not None and self.tokens[i] == text else _find(self.tokens, text)

    # -- encoding -------------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`. `add_special` adds BOS/EOS as the model wants (add_bos/add_eos);
        `parse_special` lets control tokens written in the text (e.g. "<start_of_turn>") match."""
        hf = self.hf
        with self._lock:
            hf.encode_special_tokens = not parse_special
            ids = hf.encode(text, add_special_tokens=False).ids
        if add_special:
            if self.info.add_bos and self.bos_id is not None:
                ids.insert(0, self.bos_id)
            if self.info.add_eos and self.info.eos_id is not None:
                ids.append(self.info.eos_id)
        return ids

    # -- decoding -------------------------------------------------------------------------------
    @cached_property
    def _pieces(self) -> list[bytes]:
        """The bytes each token stands for."""
        out: list[bytes] = []
        if self.info.model == "gpt2":
            table = {cp: chr(b) for cp, b in _byte_decoder().items()}
            for t, ty in zip(self.tokens, self.types, strict=False):
                if ty in (CONTROL, USER_DEFINED, UNKNOWN):
                    out.append(t.encode("utf-8"))  # added tokens are stored as plain text
                    continue
                try:
                    out.append(t.translate(table).encode("latin-1"))
                except UnicodeEncodeError:  # not in the byte alphabet: plain text too
                    out.append(t.encode("utf-8"))
        else:
            for t, ty in zip(self.tokens, self.types, strict=False):
                if ty == BYTE and len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                    out.append(bytes((int(t[3:5], 16),)))
                else:
                    out.append(t.replace(SPIECE_SPACE, " ").encode("utf-8"))
        return out

    @cached_property
    def _special_ids(self) -> frozenset[int]:
        return frozenset(i for i, ty in enumerate(self.types) if ty in (CONTROL, UNKNOWN))

    def _piece_fn(self, skip_special: bool) -> Callable[[int], bytes]:
        pieces, n = self._pieces, self.vocab_size
        special = self._special_ids if skip_special else frozenset()

        def piece(i: int) -> bytes:
            if not 0 <= i < n:
                raise EngineError(f"token id {i} out of range (vocab size {n})")
            return b"" if i in special else pieces[i]
        return piece

    def token_bytes(self, token_id: int) -> bytes:
        return self._piece_fn(False)(token_id)

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        """Text of `ids`; control tokens are written out unless `skip_special`."""
        return decode_bytes(join_bytes(self._piece_fn(skip_special), ids), self.info.add_space_prefix)

    def stream(self, skip_special: bool = False) -> StreamDecoder:
        """An incremental decoder: `.push(id) -> str`, `.flush() -> str`; pieces join to decode()."""
        return StreamDecoder(self._piece_fn(skip_special), self.info.add_space_prefix)

    # -- chat -----------------------------------------------------------------------------------
    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None, **extra: Any) -> str:
        """The prompt text (it may start with the BOS token's text, as HF templates do)."""
        try:
            return render_chat(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                               tools=tools, special=self.info.special_text, **extra)
        except EngineError as exc:  # name the GGUF whose template failed
            raise EngineError(f"{self.source}: {exc}" if self.source else str(exc)) from None

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None, **extra: Any) -> list[int]:
        """Render, then encode with special tokens parsed; BOS added once if the template did not."""
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
    has_chat_template = False  # the layout above is a fallback, not the model's own

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

    def token_bytes(self, token_id: int) -> bytes:
        return self._piece(token_id)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None, **extra: Any) -> str:
        return render_chat(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                           tools=tools, **extra)

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None, **extra: Any) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, tools, **extra))


# -- loading ------------------------------------------------------------------------------------
def _build(path: Path, key: str | None) -> tuple[VocabInfo, Loaded]:
    """Cold path: GGUF metadata -> tokenizer (and a cache entry when `key` is given)."""
    try:
        meta = read_vocab(path)
        plan = plan_tokenizer(meta)
    except GGUFError:
        raise  # already names the file
    except EngineError as exc:
        raise EngineError(f"{path}: {exc}") from exc
    try:
        hf = assemble(plan, meta.tokens)
    except Exception as exc:  # the Rust side's own errors (a merge of tokens not in the vocabulary, ...)
        raise EngineError(f"{path}: cannot build its tokenizer ({exc})") from None
    info = VocabInfo.from_meta(meta)
    if key is not None:
        cache.save_entry(key, hf, asdict(info), meta.tokens, meta.types, plan)
    return info, (meta.tokens, meta.types, hf)


def _from_cache(path: Path, key: str) -> tuple[VocabInfo, _Pending] | None:
    doc = cache.load_meta(key)
    if doc is None:
        return None
    try:
        info = VocabInfo(**doc["info"])
    except TypeError:  # written by another version
        return None

    def build() -> Loaded:
        try:
            tokens, types, plan = cache.load_vocab_and_plan(key, doc)
            return tokens, types, assemble(plan, tokens)
        except Exception:  # a damaged entry: rebuild from the GGUF (and rewrite the entry)
            return _build(path, key)[1]
    return info, _Pending(build)


_memo: dict[tuple[str, str], GGUFTokenizer] = {}
_memo_lock = threading.Lock()


def load_gguf_tokenizer(path: str | os.PathLike[str], use_cache: bool = True) -> GGUFTokenizer:
    """The tokenizer of a GGUF file; `use_cache=False` builds from the file and stores nothing."""
    path = Path(path)
    if not use_cache:
        info, loaded = _build(path, None)
        return GGUFTokenizer(info, loaded, str(path))
    try:
        key = cache.gguf_identity(path)
    except OSError as exc:
        raise EngineError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    memo = (str(path.resolve()), key)
    with _memo_lock:
        if memo in _memo:
            return _memo[memo]
    hit = _from_cache(path, key)
    info, loaded = hit if hit is not None else _build(path, key)
    tok = GGUFTokenizer(info, loaded, str(path))
    with _memo_lock:
        return _memo.setdefault(memo, tok)


def load_tokenizer(path_or_alias: str | os.PathLike[str] | None = None, use_cache: bool = True
                   ) -> GGUFTokenizer | ByteTokenizer:
    """The tokenizer of a GGUF (alias or path, see engine.gguf.aliases); "byte" or "synthetic" (the
    synthetic model's name, as for engine.load_model) give the ByteTokenizer."""
    if path_or_alias is not None and str(path_or_alias) in ("byte", "synthetic"):
        return ByteTokenizer()
    return load_gguf_tokenizer(resolve_model(path_or_alias), use_cache=use_cache)


def clear_memo() -> None:
    """Forget tokenizers loaded in this process (the next load reads the disk cache again)."""
    with _memo_lock:
        _memo.clear()
