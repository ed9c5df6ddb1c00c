"""llama.cpp's tokenizer test vectors (../shared/vocab or $FAK_VOCAB_DIR) and what several tokenizer tests share."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.errors import EngineError
from engine.tokenizer.vocab import VocabMeta
from support import paths

SEPARATOR = "\n__ggml_vocab_test__\n"


def vocab_dir() -> Path:
    env = os.environ.get("FAK_VOCAB_DIR")
    # CI clones the repo next to a copy of shared/: <repo>/../shared/vocab
    return Path(env) if env else paths.REPO.parent / "shared" / "vocab"


def vocab_files() -> list[Path]:
    return sorted(p for p in vocab_dir().glob("*.gguf")
                  if p.with_name(p.name + ".inp").exists() and p.with_name(p.name + ".out").exists())


def read_cases(gguf: Path) -> list[tuple[str, list[int]]]:
    texts = gguf.with_name(gguf.name + ".inp").read_text(encoding="utf-8").split(SEPARATOR)
    lines = gguf.with_name(gguf.name + ".out").read_text(encoding="utf-8").split("\n")
    assert texts[-1] == "" and lines[-1] == "", f"{gguf.name}: unexpected trailer in .inp/.out"
    texts, lines = texts[:-1], lines[:-1]
    assert len(texts) == len(lines), f"{gguf.name}: {len(texts)} inputs but {len(lines)} outputs"
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines, strict=False)]


def no_gguf_vocab(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Make the GGUF vocabulary reader fail: a load that still works read the cache entry instead."""
    import engine.tokenizer.tokenizer as T

    calls: list[Path] = []

    def refuse(path: Path) -> VocabMeta:
        calls.append(Path(path))
        raise EngineError("test: the warm path must not read the GGUF vocabulary")

    monkeypatch.setattr(T, "read_vocab", refuse)
    return calls


MIXED = (
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
    "\t\tTabs\tand    runs   of  spaces  \n\n\n"
    "Emoji: 😀👍🏽🇫🇷 ❤️‍🔥  CJK: 日本語のテキスト、中文字符，한국어 텍스트\n"
    "Numbers: 0 7 42 1234567890 3.14159 -2.5e-10 1,000,000 ½ ⅞\n"
    "Mixed: naïve café Ünïcödé Ελληνικά русский عربى हिन्दी\r\n"
    "Symbols: <b>bold</b> {\"k\": [1, 2]} $x^2$ ~/path/to/file.py && echo ok || exit 1\n"
    "trailing spaces   "
)
