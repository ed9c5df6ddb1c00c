"""GrammarSpec -> llguidance grammar -> a Matcher per lane; one GrammarCompiler per tokenizer.

Why llguidance (bench/grammar_libs.py on numpy float32 logits, three JSON schemas replayed token by
token, 1780 tokens; per token the fastest of 5 replays of mask fill + consume, so load spikes of the
shared 2-core box drop out; µs p50 / p99 / mean, Gemma 3's 262,144-token vocabulary, then Qwen2's 151,936):
- llguidance 1.9.1:    35 / 112 / 38;  24 / 136 / 29. Tokenizer setup ~3 s once, matcher start 1-5 ms,
  schema "compile" none (it is parsed at matcher start); no torch; Lark CFGs with %json (a literal
  prefix + a JSON schema + a literal suffix), regex. The lowest per-token cost of what can be used.
- xgrammar 0.2.9:      14 / 73 / 24;   7 / 54 / 14. Faster, but `import xgrammar` imports torch (its
  wheel requires torch, triton and transformers, ~1.7 GB): torch would be a runtime dependency. Not used.
- outlines-core 0.2.14: 6 / 832 / 161; 4 / 410 / 83. 1-6 s to compile each new schema (an index over
  the whole vocabulary, paid by the first request with it), a mean 4x llguidance's (some states cost
  0.4-0.85 ms per token), regular languages only (no recursive JSON). Not used.
The mask is applied by engine/kernels/bitmask.py (~35 µs for 262k logits, in place), the same for all.

The tokenizer-level build (LLTokenizer over every token's bytes) takes ~3 s for 262k tokens and holds
the GIL meanwhile: it happens once per tokenizer, lazily on the first constrained admit, or up front
with `warm()` (a server can call it at start). Each spec compiles once (cached, LRU); a request gets a
deep copy of the cached matcher (µs).
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from collections import OrderedDict
from typing import Any

from engine.errors import EngineError
from engine.grammar.matcher import Matcher
from engine.grammar.spec import MAX_WHITESPACE, GrammarSpec
from engine.grammar.vocab import GrammarVocab, grammar_vocab

CACHE_SPECS = 128  # compiled specs kept per tokenizer


def _lark_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _json_body(spec: GrammarSpec) -> str:
    schema = spec.schema
    opts: dict[str, Any] = dict(schema.get("x-guidance") or {})  # a caller's own llguidance options win
    if spec.separators is None:
        opts.setdefault("whitespace_pattern", f"[ \\t\\n\\r]{{0,{MAX_WHITESPACE}}}")
    else:
        opts.setdefault("whitespace_flexible", False)
        opts.setdefault("item_separator", spec.separators[0])
        opts.setdefault("key_separator", spec.separators[1])
    schema["x-guidance"] = opts
    return "%json " + json.dumps(schema, ensure_ascii=False)


def to_lark(spec: GrammarSpec) -> str:
    """The spec as llguidance Lark: one rule per json / sequence / choice node, literals and regexes inline."""
    rules: list[str] = []

    def expr(s: GrammarSpec) -> str:
        if s.kind == "literal":
            return _lark_string(s.text) if s.text else '""'
        if s.kind == "regex":
            return "/" + s.text.replace("/", "\\/") + "/"
        name = f"g{len(rules)}"
        rules.append("")
        if s.kind == "json":
            body = _json_body(s)
        elif s.kind == "sequence":
            body = " ".join(expr(p) for p in s.parts) or '""'
        else:
            body = " | ".join(expr(p) for p in s.parts)
        rules[int(name[1:])] = f"{name}: {body}"
        return name

    top = expr(spec)
    return "\n".join([f"start: {top}", *rules])


class GrammarCompiler:
    """Specs compiled against one tokenizer's vocabulary (thread-safe; admit() may run on any thread)."""

    def __init__(self, tokenizer: Any, vocab_size: int | None = None, eos_ids: tuple[int, ...] | None = None) -> None:
        self._source = tokenizer
        self._vocab_size = vocab_size
        self._eos = eos_ids
        self._lock = threading.Lock()
        self._tok: Any = None  # llguidance.LLTokenizer, built on first use
        self.vocab: GrammarVocab | None = None
        self.mask_tokens = 0  # bits in a mask (the vocabulary, plus a stand-in EOS when it has none)
        self._cache: OrderedDict[GrammarSpec, Any] = OrderedDict()

    def warm(self) -> None:
        """Build the tokenizer-level tables now (idempotent)."""
        with self._lock:
            self._tokenizer()

    def _tokenizer(self) -> Any:
        if self._tok is not None:
            return self._tok
        import llguidance

        v = grammar_vocab(self._source, self._vocab_size)
        eos = [i for i in (self._eos if self._eos is not None else v.eos_ids) if 0 <= i < v.size]
        marked = set(v.special)
        tokens = [b"\xff" + _special_text(self._source, i) if i in marked else p for i, p in enumerate(v.pieces)]
        if not eos:  # llguidance needs an end token: a byte vocabulary has none, so add one past the logits
            eos = [len(tokens)]
            tokens.append(b"\xff<eos>")
            marked.add(eos[0])
        source = self._source

        class _Wrap:  # what llguidance.TokenizerWrapper reads
            eos_token_id, bos_token_id = eos[0], None
            special_token_ids = sorted(marked)

            def __call__(self, s: bytes) -> list[int]:  # used for forced text only
                return list(source.encode(s.decode("utf-8", "replace"), add_special=False))

        _Wrap.tokens = tokens  # type: ignore[attr-defined]
        self._tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Wrap()), eos_token=eos)
        self.vocab, self.mask_tokens = v, len(tokens)
        return self._tok

    def compile(self, spec: GrammarSpec) -> Any:
        """The cached, unstarted llguidance matcher of `spec`; EngineError if the spec does not compile."""
        import llguidance

        if not isinstance(spec, GrammarSpec):
            raise EngineError(f"Request.grammar must be a GrammarSpec, got {type(spec).__name__}")
        with self._lock:
            hit = self._cache.get(spec)
            if hit is not None:
                self._cache.move_to_end(spec)
                return hit
            tok = self._tokenizer()
        lark = to_lark(spec)
        grammar = llguidance.LLMatcher.grammar_from_lark(lark)
        m = llguidance.LLMatcher(tok, grammar, log_level=0)  # drops the GIL while it builds
        if m.is_error():
            raise EngineError(f"invalid grammar: {_first_line(m.get_error())}")
        with self._lock:
            self._cache[spec] = m
            while len(self._cache) > CACHE_SPECS:
                self._cache.popitem(last=False)
        return m

    def matcher(self, spec: GrammarSpec) -> Matcher:
        """A fresh Matcher of `spec` for one lane."""
        return Matcher(self.compile(spec).deep_copy(), self.mask_tokens)


def _special_text(tok: Any, i: int) -> bytes:
    try:
        return bytes(tok.token_bytes(i))
    except EngineError:  # padding past the vocabulary
        return f"<pad{i}>".encode()


def _first_line(msg: str) -> str:
    """llguidance's message, first line, without its position in our generated Lark ("at 2(5): ")."""
    line = msg.strip().splitlines()[0] if msg.strip() else "unknown error"
    return re.sub(r"^at \d+\(\d+\): ", "", line)


_compilers: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], GrammarCompiler]] = weakref.WeakKeyDictionary()
_compilers_lock = threading.Lock()


def compiler_for(tokenizer: Any, vocab_size: int | None = None, eos_ids: tuple[int, ...] | None = None
                 ) -> GrammarCompiler:
    """The GrammarCompiler of a tokenizer (one per tokenizer object, vocab width and end ids: schedulers
    over the same tokenizer share it, so its tables are built once per process)."""
    key = (vocab_size, eos_ids)
    with _compilers_lock:
        per = _compilers.setdefault(tokenizer, {})
        if key not in per:
            per[key] = GrammarCompiler(tokenizer, vocab_size, eos_ids)
        return per[key]
