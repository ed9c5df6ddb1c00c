"""GGUF file -> metadata, tensor views (memory-mapped), ModelConfig and weights.

The one reader of the GGUF wire format (the model loader, diag and the tokenizer all come here). It
walks the header over an mmap rather than using gguf.GGUFReader, which builds a numpy view per
metadata item and takes ~18 s on Gemma's 262k-token vocabulary: here that is ~0.15 s for everything
and ~0.1 s for the tokenizer's keys, because values nobody asked for are stepped over, not decoded.
Type enums and block sizes come from `gguf`. Every bounds or size problem is one GGUFError line
naming the file, the section and the key or tensor.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as QT

from engine.errors import GGUFError

GGUF_MAGIC = b"GGUF"
# GGUF value types with a fixed size -> struct format; numpy reads the same letters (bool arrays as u1)
_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_FIXED = {t: (struct.Struct(f), np.dtype("<u1" if t == 7 else f)) for t, f in _FMT.items()}
_STRING, _ARRAY = 8, 9
_U32, _U64 = _FIXED[4][0], _FIXED[10][0]


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
    """Reads the header front to back; `section` and `item` say where, for the one error line."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.path, self.size, self.pos = buf, path, len(buf), 0
        self.section, self.item = "header", ""

    def fail(self, what: str) -> GGUFError:
        where = f"{self.item}: " if self.item else ""
        return GGUFError(f"{self.path}: truncated or corrupt GGUF {self.section} ({where}{what})")

    def take(self, n: int) -> int:
        """Step over n bytes; returns where they start."""
        start, end = self.pos, self.pos + n
        if end > self.size:
            raise self.fail(f"needs byte {end}, file has {self.size}")
        self.pos = end
        return start

    def scalar(self, st: struct.Struct) -> Any:
        return st.unpack_from(self.buf, self.take(st.size))[0]

    def string(self) -> str:
        start = self.take(self.scalar(_U64))
        return self.buf[start : self.pos].decode("utf-8", errors="replace")

    def strings(self, count: int, keep: bool) -> list[str]:
        # the hot loop (262k vocabulary entries): locals only, one bounds test per string; a length
        # past the end fails in unpack_from or in the test
        buf, size, pos, unpack = self.buf, self.size, self.pos, _U64.unpack_from
        out: list[str] = []
        try:
            for _ in range(count):
                end = pos + 8 + unpack(buf, pos)[0]
                if end > size:
                    raise IndexError
                if keep:
                    out.append(buf[pos + 8 : end].decode("utf-8", errors="replace"))
                pos = end
        except (struct.error, IndexError):
            raise self.fail(f"an array of {count} strings runs past the end of the file ({size} bytes)") from None
        self.pos = pos
        return out

    def value(self, vtype: int, keep: bool = True) -> Any:
        """One value of type `vtype`; keep=False steps over arrays without decoding (the caller drops the result)."""
        if vtype in _FIXED:
            return self.scalar(_FIXED[vtype][0])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise self.fail(f"unknown metadata value type {vtype} at byte {self.pos - 4}")
        etype, count = self.scalar(_U32), self.scalar(_U64)
        if etype in _FIXED:
            dt = _FIXED[etype][1]
            start = self.take(count * dt.itemsize)
            return np.frombuffer(self.buf, dt, count, start).copy() if keep else None
        if etype == _STRING:
            return self.strings(count, keep)
        if etype != _ARRAY:
            raise self.fail(f"unknown metadata array element type {etype} at byte {self.pos - 12}")
        return [self.value(etype, keep) for _ in range(count)]  # arrays of arrays: rare and small


def _read_header(path: Path, prefixes: tuple[str, ...] | None, with_tensors: bool) -> GGUFFile:
    """Magic, version, the key/value section (only keys starting with `prefixes`, when given) and, with
    `with_tensors`, the tensor-info table as memmapped views checked against the file's length."""
    try:
        with open(path, "rb") as f:
            if f.seek(0, 2) == 0:
                raise GGUFError(f"{path}: not a GGUF file (empty)")
            data = np.memmap(f, dtype=np.uint8, mode="r") if with_tensors else None
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                cur = _Cursor(buf, path)
                g, n_tensors = _read_kv(cur, prefixes)
                if data is not None:
                    g.tensors = _read_tensor_index(cur, n_tensors, g.metadata, data)
                return g
    except OSError as exc:
        raise GGUFError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def _read_kv(cur: _Cursor, prefixes: tuple[str, ...] | None) -> tuple[GGUFFile, int]:
    """Magic, version and the key/value section; also the tensor count the header gives."""
    path = cur.path
    if cur.buf[:4] != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (bad magic {cur.buf[:4]!r})")
    cur.pos = 4
    version = cur.scalar(_U32)
    if version not in (2, 3):  # 1 is pre-2023; a huge number means a big-endian file
        raise GGUFError(f"{path}: GGUF version {version} is not supported (need 2 or 3, little-endian)")
    n_tensors, n_kv = cur.scalar(_U64), cur.scalar(_U64)
    md: dict[str, Any] = {}
    cur.section = "metadata"
    for i in range(n_kv):
        cur.item = f"key {i} of {n_kv}"
        key = cur.string()
        cur.item = f"key {key!r}"
        keep = prefixes is None or key.startswith(prefixes)
        value = cur.value(cur.scalar(_U32), keep)
        if keep:
            md[key] = value
    return GGUFFile(path, int(version), md, {}), n_tensors


def _read_tensor_index(cur: _Cursor, n_tensors: int, md: dict[str, Any], data: np.ndarray) -> dict[str, TensorInfo]:
    """The tensor-info table that follows the metadata; data starts at the next `general.alignment`."""
    path = cur.path
    cur.section = "tensor index"
    entries = []
    for i in range(n_tensors):
        cur.item = f"tensor {i} of {n_tensors}"
        name = cur.string()
        cur.item = f"tensor {name!r}"
        n_dims = cur.scalar(_U32)
        if n_dims > 4:
            raise GGUFError(f"{path}: tensor {name!r} has {n_dims} dimensions")
        ne = [cur.scalar(_U64) for _ in range(n_dims)]
        tval, off = cur.scalar(_U32), cur.scalar(_U64)
        try:
            qtype = QT(tval)
        except ValueError:
            raise GGUFError(f"{path}: tensor {name!r} has unknown type id {tval}") from None
        entries.append((name, qtype, ne, off))
    align = md.get("general.alignment", 32)
    if not isinstance(align, int) or isinstance(align, bool) or align <= 0:
        raise GGUFError(f"{path}: metadata key 'general.alignment' must be a positive integer, got {align!r}")
    data_start = -(-cur.pos // align) * align
    tensors: dict[str, TensorInfo] = {}
    for name, qtype, ne, off in entries:
        bs, ts = GGML_QUANT_SIZES[qtype]
        if 0 in ne:
            raise GGUFError(f"{path}: tensor {name!r} has an empty dimension {ne}")
        row = ne[0] if ne else 1  # no dimensions: one element, as in ggml
        if row % bs:
            raise GGUFError(f"{path}: tensor {name!r} row of {row} is not a multiple of the {qtype.name} block {bs}")
        nbytes = math.prod(ne) // bs * ts  # Python ints: a corrupt dimension must not wrap around like int64
        start = data_start + off
        if start + nbytes > cur.size:
            raise GGUFError(f"{path}: truncated file (tensor {name!r} needs bytes up to {start + nbytes}, "
                            f"file has {cur.size})")
        raw = data[start : start + nbytes].reshape(-1, row // bs * ts)
        tensors[name] = TensorInfo(name, qtype, tuple(int(d) for d in reversed(ne)), start, nbytes, raw)
    return tensors


def read_metadata(path: str | Path, prefixes: tuple[str, ...]) -> dict[str, Any]:
    """The key/value pairs whose key starts with one of `prefixes`; other values are stepped over, not
    decoded (a 262k-string array then costs a walk over its lengths). The tensor table is not read."""
    return _read_header(Path(path), prefixes, with_tensors=False).metadata


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse header + tensor index; tensor bytes stay memory-mapped. Raises GGUFError naming the file."""
    return _read_header(Path(path), None, with_tensors=True)
