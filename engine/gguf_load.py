"""GGUF file -> metadata, tensor views (memory-mapped), ModelConfig and weights.

The header is parsed here rather than with gguf.GGUFReader: the reader builds a numpy view per
metadata item and takes ~18 s on Gemma's 262k-token vocabulary; this parser takes well under a
second and hands out the same memmapped tensor bytes. Type enums and block sizes come from `gguf`.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT

from engine.errors import EngineError, GGUFError

GGUF_MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NP = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9


@dataclass
class TensorInfo:
    name: str
    qtype: QT
    shape: tuple[int, ...]  # numpy order: (rows, cols) for a matrix; GGUF ne[] reversed
    offset: int  # absolute file offset of the data
    nbytes: int
    raw: np.ndarray  # uint8 memmap view [rows, row_bytes] (1-D tensors: [1, bytes])

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))


@dataclass
class GGUFFile:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]


class _Cursor:
    def __init__(self, buf: np.ndarray, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path
        self.mv = memoryview(buf)  # type: ignore[arg-type]

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError(f"{self.path}: truncated file (header needs byte {self.pos + n}, file has {len(self.buf)})")
        out = self.mv[self.pos : self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        return bytes(self.take(n)).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.scalar("<I"), self.scalar("<Q")
            if etype in _NP:
                dt = np.dtype(_NP[etype])
                return np.frombuffer(self.take(count * dt.itemsize), dtype=dt).copy()
            return [self.value(etype) for _ in range(count)]
        raise GGUFError(f"{self.path}: unknown metadata value type {vtype} at byte {self.pos}")


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse header + tensor index; tensor bytes stay memory-mapped. Raises GGUFError naming the file."""
    path = Path(path)
    try:
        buf = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as exc:  # ValueError: empty file
        raise GGUFError(f"{path}: cannot map file ({exc})") from exc
    cur = _Cursor(buf, path)
    if len(buf) < 4 or bytes(buf[:4]) != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (bad magic {bytes(buf[:4])!r})")
    cur.pos = 4
    version = cur.scalar("<I")
    if version not in (2, 3):
        raise GGUFError(f"{path}: unsupported GGUF version {version}")
    n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
    md: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        md[key] = cur.value(cur.scalar("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.scalar("<I")
        if n_dims > 4:
            raise GGUFError(f"{path}: tensor {name!r} has {n_dims} dimensions")
        ne = [cur.scalar("<Q") for _ in range(n_dims)]
        tval, off = cur.scalar("<I"), cur.scalar("<Q")
        try:
            qtype = QT(tval)
        except ValueError:
            raise GGUFError(f"{path}: tensor {name!r} has unknown type id {tval}") from None
        infos.append((name, qtype, ne, off))
    align = md.get("general.alignment", 32)
    if not isinstance(align, int) or isinstance(align, bool) or align <= 0:
        raise GGUFError(f"{path}: metadata key 'general.alignment' must be a positive integer, got {align!r}")
    data_start = -(-cur.pos // align) * align
    tensors: dict[str, TensorInfo] = {}
    for name, qtype, ne, off in infos:
        bs, ts = GGML_QUANT_SIZES[qtype]
        if 0 in ne:
            raise GGUFError(f"{path}: tensor {name!r} has an empty dimension {ne}")
        n = math.prod(ne)  # Python ints: a corrupt dimension must not wrap around like int64 would
        if ne and ne[0] % bs:
            raise GGUFError(f"{path}: tensor {name!r} row of {ne[0]} is not a multiple of the {qtype.name} block {bs}")
        nbytes = n // bs * ts
        start = data_start + off
        if start + nbytes > len(buf):
            raise GGUFError(f"{path}: truncated file (tensor {name!r} needs bytes up to {start + nbytes}, file has {len(buf)})")
        row_bytes = ne[0] // bs * ts if ne else nbytes
        raw = buf[start : start + nbytes].reshape(-1, row_bytes)
        tensors[name] = TensorInfo(name, qtype, tuple(int(d) for d in reversed(ne)), start, nbytes, raw)
    return GGUFFile(path, int(version), md, tensors)


def load_gguf_model(path_or_alias: str | Path | None, resident: bool = False, progress: bool | None = None) -> Any:
    """Alias or path -> engine.model.Model with float32 weights (plain) or resident quantized blocks."""
    from engine.aliases import default_model, resolve_model
    from engine.weights import build_model

    if (path_or_alias if path_or_alias is not None else default_model()) == "synthetic":
        from engine.synthetic import synthetic_model

        return synthetic_model()  # FAK_MODEL=synthetic selects it too
    path = resolve_model(path_or_alias)
    g = read_gguf(path)
    make = _resident_factory(path) if resident else None
    return build_model(g, make_resident=make, progress=progress)


def _resident_factory(path: Path) -> Callable[..., Any]:
    try:
        from engine.resident import resident_weight
    except ImportError as exc:
        raise EngineError(f"{path}: resident path not available (engine.resident has not landed: {exc})") from exc
    return resident_weight
