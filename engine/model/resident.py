"""Resident quantized weights: the GGUF's quantized bits kept in memory, computed on by numba kernels.

`resident_weight(name, qtype, raw, shape)` is what the loader calls for every 2-D tensor when
`load_model(..., resident=True)`. Q8_0 / Q5_0 / Q4_K / Q6_K / Q4_0 / Q4_1 / Q5_1 / Q5_K become a
`QuantWeight`: by default their blocks repacked at load into 16-row tiles of the same bits
(engine/quant/tiles.py; the file pages are then dropped, so RSS holds one copy: ~1.01x the file),
multiplied on int16 dots (engine/kernels/tilegemm.py) (Q3_K and IQ4_NL too, first widened to Q6_K
and Q8_0 blocks of the same values: engine/quant/widen.py); under FAK_TILES=0 the first four keep the
memory-mapped GGUF blocks themselves, on the float32 kernels of engine/kernels/blockdot.py (the
other types have tiles only). F16 / BF16 matrices become tiles of their 16-bit floats, multiplied
as floats (half the bytes of a float32 copy); F32 ones (and F16 / BF16 with rows not a multiple of
32) a float32 ndarray for the plain path's matmul. Any other type has no resident kernel: loading
it names the tensor and the type and points to --plain (the float32 path reads every type
engine/quant/dequant.py knows).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES

from engine.errors import EngineError
from engine.kernels import tilegemm as T
from engine.kernels.blockdot import gemm
from engine.kernels.parallel import launch, prefill_pool, serial_twin, warming
from engine.model.scratch import Scratch
from engine.quant import rows as K
from engine.quant import tiles as L
from engine.quant.widen import WIDEN

# Rows past the last lane group of 8 meet a tile in groups of 4, 2 and 1. On a Zen 4 host a group's pass
# costs about the same for 1, 2 or 4 lanes (Qwen 2.5 0.5B's ffn_down: 0.038 ms for 1 row, 0.071 for 2 as two
# passes of 1, 0.072 for 4, 0.116 for 8; its head 2.8 / 3.1 / 3.5 / 2.9 ms for 1 / 2 / 3 / 4): so 3 rows go
# as 4, and 6 or 7 as 8, with the last row repeated. A whole Qwen step (500 tokens of context): 3 rows 16.4
# -> 12.7 ms, 6 rows 20.2 -> 17.5, 7 rows 23.6 -> 17.9. 2 rows take the 2-lane group, not a padded 4: on an
# AVX2 host without VNNI (Zen 2) the 4-lane pass is compute-bound, and Q4_K's 2-lane pass costs 1.6x a
# 1-lane one where the padded 4 cost 2.6x (Q6_K 1.3x against 2.1x).
PAD_LANES = {3: 1, 6: 2, 7: 1}  # rows % 8 -> rows added

QUANT_TYPES = {QT.Q8_0: "Q8_0", QT.Q5_0: "Q5_0", QT.Q4_K: "Q4_K", QT.Q6_K: "Q6_K", QT.Q4_0: "Q4_0",
               QT.Q4_1: "Q4_1", QT.Q5_1: "Q5_1", QT.Q5_K: "Q5_K", QT.F16: "F16", QT.BF16: "BF16",
               QT.Q3_K: "Q3_K", QT.IQ4_NL: "IQ4_NL"}
STORED_AS = {QUANT_TYPES[t]: QUANT_TYPES[wide] for t, (wide, _) in WIDEN.items()}  # Q3_K -> Q6_K, IQ4_NL -> Q8_0
DQ_ROWS = K.DQ_ROWS  # the GGUF block layouts' row dequantizers (tiles: tilegemm.dq_rows_tiles)
DENSE_TYPES = (QT.F32,)

# GGUF block layouts (FAK_TILES=0): below this many rows matmul_prefill uses the decode kernel
# (dequantizing a whole weight for a handful of rows costs more than it saves); above it, float32
# row tiles + BLAS (compute bound). Tiled weights always take their int16-dot kernel.
PREFILL_BLAS_MIN_ROWS = 8
_TILE_BYTES = 4 << 20  # float32 tile size for prefill: fits L2/L3, big enough for BLAS
TILED = "x16"  # layout suffix of the 16-row tiles


@dataclass(eq=False)
class QuantWeight:
    """One quantized 2-D weight [out_features, in_features], resident in `layout`."""

    name: str
    qtype: QT
    raw: np.ndarray  # uint8 tiles (tiles.tiled_shape), or GGUF rows [out_features, row_bytes]
    shape: tuple[int, int]
    layout: str = ""  # format of `raw`: "<type>x16" tiles (the default), a GGUF type, or Q8_0 for Q5_0
    _kind: str = field(init=False, repr=False)
    _tile: int = field(init=False, repr=False)  # tile kind code (tiles.KINDS), -1: GGUF blocks
    group: Any = field(default=None, repr=False)  # engine.model.fuse.FusedWeight when `raw` is a band of one

    def __post_init__(self) -> None:
        self.layout = self.layout or QUANT_TYPES[self.qtype]
        self._kind = self.layout
        self._tile = L.KINDS.index(self.layout[:-3]) if self.layout.endswith(TILED) else -1
        if self._tile >= 0:
            _groups_used.add(L.kind_group(self._tile))  # what warmup() compiles

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)

    @property
    def type_name(self) -> str:
        return QUANT_TYPES[self.qtype]

    def _x2d(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.shape[1]:
            raise EngineError(f"{self.name}: activation shape {x.shape} does not match weight {self.shape}")
        return x

    def matmul(self, x: np.ndarray, out: Scratch | None = None) -> np.ndarray:
        """x [B, in] -> [B, out] (decode path: each row bit-identical whatever B is); written into `out`'s
        buffer when given (a view of it is returned)."""
        x = np.asarray(x)
        squeeze = x.ndim == 1
        if squeeze or x.dtype != np.float32 or not x.flags.c_contiguous or x.shape[1] != self.shape[1]:
            x2 = self._x2d(np.atleast_2d(x))
        else:  # the decode path's own rows: no conversion, no copy
            x2 = x
        b = x2.shape[0]
        pad = PAD_LANES.get(b % 8, 0) if self._tile >= 0 else 0
        if pad:  # the last real row again: a lane's bits do not depend on its lane group, or on its mates
            x2 = np.concatenate([x2, np.repeat(x2[-1:], pad, axis=0)])
        y = out.take(x2.shape[0], self.shape[0]) if out is not None else \
            np.empty((x2.shape[0], self.shape[0]), dtype=np.float32)
        work = x2.shape[0] * self.shape[0] * self.shape[1]
        # small products run on one thread (waking the team costs more than it saves)
        if self._tile >= 0:
            launch(T.gemm_for(self._tile), work, self._tile, self.raw, x2, y)
            y = y[:b]
        else:
            launch(gemm, work, self.raw, x2, y, K.F16_LUT, K.KIND[self._kind])
        return y[0] if squeeze else y

    def matmul_prefill(self, x: np.ndarray) -> np.ndarray:
        """x [T, in] -> [T, out] for a prefill chunk: tiled weights run the decode kernel on all rows
        at once; GGUF blocks are dequantized to float32 row tiles once and multiplied with BLAS."""
        x2 = self._x2d(np.atleast_2d(x))
        if x2.shape[0] < PREFILL_BLAS_MIN_ROWS or self._tile >= 0:
            # tiles: the int16-dot kernel beats dequantize + BLAS (512-token prefill +22-35%,
            # 2048 on par) and gives prefill the decode path's numbers
            return self.matmul(x2)
        rows, n = self.shape
        out = np.empty((x2.shape[0], rows), dtype=np.float32)
        step = max(16, min(rows, _TILE_BYTES // (4 * n)))
        pool = prefill_pool()
        parts = numba.config.NUMBA_NUM_THREADS  # the pool's size
        if pool is None or rows < 16 * parts:
            self._prefill_rows(x2, out, 0, rows, step)
            return out
        # One worker per core, each a serial dequantize + single-threaded BLAS on its share of the
        # rows: no OpenBLAS and OpenMP thread teams spinning against each other on the same cores.
        bounds = [rows * i // parts // 16 * 16 for i in range(parts)] + [rows]
        futs = [pool.submit(self._prefill_rows, x2, out, a, b, step, True)
                for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
        for f in futs:
            f.result()
        return out

    def _prefill_rows(self, x2: np.ndarray, out: np.ndarray, r0: int, r1: int, step: int, one_thread: bool = False) -> None:
        dq = serial_twin(DQ_ROWS[self._kind]) if one_thread else DQ_ROWS[self._kind]
        tile = np.empty((min(step, r1 - r0), self.shape[1]), dtype=np.float32)
        for a in range(r0, r1, step):
            b = min(r1, a + step)
            t = tile[: b - a]
            dq(self.raw, np.arange(a, b, dtype=np.int64), t, K.F16_LUT, K.QK)
            out[:, a:b] = x2 @ t.T

    def take(self, ids: np.ndarray | list[int]) -> np.ndarray:
        """Rows `ids` dequantized to float32 [len(ids), in] (embedding lookup)."""
        rows = np.ascontiguousarray(np.asarray(ids, dtype=np.int64).reshape(-1))
        if rows.size and (rows.min() < 0 or rows.max() >= self.shape[0]):
            raise EngineError(f"{self.name}: row id out of range [0, {self.shape[0]})")
        out = np.empty((rows.shape[0], self.shape[1]), dtype=np.float32)
        if self._tile >= 0:  # each row through its tile: 16x the work, but take is one row a token
            T.dq_rows_for(self._tile)(self._tile, self.raw, rows, out)
        else:
            launch(DQ_ROWS[self._kind], out.size * 8, self.raw, rows, out, K.F16_LUT, K.QK)  # 1 row: 1 thread
        return out

    def dequantize(self) -> np.ndarray:
        """The whole weight as float32 [out, in]."""
        return self.take(np.arange(self.shape[0], dtype=np.int64))


def _dense(name: str, qtype: QT, raw: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    a = np.asarray(raw)
    if qtype == QT.F32:
        a = a.view(np.float32) if a.dtype != np.float32 else a
    elif qtype == QT.F16:
        a = (a.view(np.float16) if a.dtype != np.float16 else a).astype(np.float32)
    else:  # BF16: the high half of a float32
        bits = a.view(np.uint16) if a.dtype != np.uint16 else a
        a = (bits.astype(np.uint32) << 16).view(np.float32)
    if a.size != shape[0] * shape[1]:
        raise EngineError(f"{name}: {qtype.name} data has {a.size} values, expected {shape[0]}x{shape[1]}")
    return np.ascontiguousarray(a.reshape(shape), dtype=np.float32)


def check_resident(name: str, qtype: QT) -> None:
    """Raise the one-line error for a 2-D tensor whose type has no resident kernel (what to do: --plain)."""
    if QT(qtype) not in QUANT_TYPES and QT(qtype) not in DENSE_TYPES:
        raise EngineError(f"tensor {name!r} is {QT(qtype).name}, which has no resident kernel "
                          f"(resident: {', '.join(QUANT_TYPES.values())}, F32); run with --plain to "
                          f"dequantize every weight to float32")


def tiled_kind(qtype: QT, in_features: int) -> str | None:
    """The QuantWeight kind a 2-D tensor of `qtype` with rows of `in_features` values becomes (None:
    a float32 ndarray, or no resident kernel at all if qtype is not in QUANT_TYPES either)."""
    qtype = QT(qtype)
    if qtype not in QUANT_TYPES or (qtype in (QT.F16, QT.BF16) and in_features % L.QB):
        return None
    return QUANT_TYPES[qtype]


def resident_weight(name: str, qtype: QT, raw: np.ndarray, shape: tuple[int, int]) -> QuantWeight | np.ndarray:
    """The resident form of one 2-D GGUF tensor (shape = (out_features, in_features))."""
    qtype = QT(qtype)
    out_f, in_f = int(shape[0]), int(shape[1])
    if qtype in DENSE_TYPES or (qtype in (QT.F16, QT.BF16) and tiled_kind(qtype, in_f) is None):
        return _dense(name, qtype, raw, (out_f, in_f))
    check_resident(name, qtype)
    kind = QUANT_TYPES[qtype]
    stored = STORED_AS.get(kind, kind)  # Q3_K / IQ4_NL: kept as the wider type of the same values
    bs, bb = GGML_QUANT_SIZES[qtype]
    if in_f % bs:
        raise EngineError(f"{name}: {kind} row length {in_f} is not a multiple of {bs}")
    row_bytes = in_f // bs * bb
    a = np.asarray(raw)
    if a.dtype != np.uint8:
        a = a.view(np.uint8)
    if a.size != out_f * row_bytes:
        raise EngineError(f"{name}: {kind} data is {a.size} bytes, expected {out_f}x{row_bytes} for shape {shape}")
    a = np.ascontiguousarray(a).reshape(out_f, row_bytes).view()
    # no warmup() here: the load may run on another thread than the forward passes, and a parallel
    # region entered from a second thread costs both threads (engine/kernels/parallel.py)
    # only a read-only file mapping may drop its pages (a private mapping could hold edits)
    file_ro = getattr(raw, "_mmap", None) is not None and not np.asarray(raw).flags.writeable
    src = a
    if stored != kind:
        a = WIDEN[qtype][1](a)
    layout = resident_layout(stored)
    if layout == "Q8_0" and stored == "Q5_0":
        a = _repack_q5_0(a)
    elif layout != stored:
        a = _tiles(L.KINDS.index(stored), a, in_f)
    if a is not src and file_ro and src.size:
        _drop_pages(src)
    a.setflags(write=False)  # one kernel specialization (memmaps are read-only anyway)
    return QuantWeight(name, qtype, a, (out_f, in_f), layout)


def resident_layout(kind: str) -> str:
    """The format a quant type is kept in: 16-row tiles ("<type>x16", engine/quant/tiles.py) for the
    integer-dot kernels of engine/kernels/tiledot.py. For A/B runs, FAK_TILES=0 keeps the GGUF blocks (the
    float32 kernels of engine/kernels/blockdot.py; types without such a kernel stay tiled), Q5_0 then
    repacked as Q8_0 unless FAK_Q5_0_REPACK=0. Q3_K and IQ4_NL take the layout of the type they are
    widened to (Q6_K, Q8_0)."""
    kind = STORED_AS.get(kind, kind)
    if os.environ.get("FAK_TILES", "1") != "0" or kind not in K.KIND:
        return kind + TILED
    if kind == "Q5_0" and os.environ.get("FAK_Q5_0_REPACK", "1") != "0":
        return "Q8_0"
    return kind


def resident_nbytes(kind: str, rows: int, cols: int) -> int:
    """Bytes a [rows, cols] tensor of quant type `kind` holds once resident (what `QuantWeight.nbytes`
    reports and a decode step streams): tiles pad rows to 16, and Q4_K / Q5_K tiles unpack their 6-bit
    scales (+4 bytes per 256 values); GGUF blocks as in the file, Q5_0 widened to Q8_0 when repacked."""
    layout = resident_layout(kind)
    if layout.endswith(TILED):
        shape = L.tiled_shape(L.KINDS.index(layout[:-3]), rows, cols)
        return shape[0] * shape[1]
    return rows * (cols // K.BLOCK_SIZE[layout]) * K.BLOCK_BYTES[layout]


def _tiles(code: int, a: np.ndarray, in_f: int) -> np.ndarray:
    """GGUF rows [out_f, row_bytes] of in_f values -> 16-row tiles (rows padded to a multiple of 16)."""
    out = np.empty(L.tiled_shape(code, a.shape[0], in_f), np.uint8)
    src = a.view()
    src.setflags(write=False)  # one specialization: the memmaps are read-only
    L.repack_tiles(code, src, out)
    return out


def _repack_q5_0(a: np.ndarray) -> np.ndarray:
    """Q5_0 blocks -> Q8_0 blocks of the same values (34/22 of the bytes: +10% of Gemma 270M's file).

    Why: the Q8_0 GEMV runs ~2x the Q5_0 one per element on this CPU class, which outweighs the extra
    bytes (decode +~15%, bench/decode.py; FAK_Q5_0_REPACK=0 turns it off for A/B). After any repack
    resident_weight drops the source pages of a file mapping from this process (MADV_DONTNEED on a
    shared read-only mapping only unmaps; a later read faults them back from the page cache), so RSS
    holds the repacked copy, not both (tests/engine/model/test_resident_memory.py)."""
    out = np.empty((a.shape[0], a.shape[1] // 22 * 34), dtype=np.uint8)
    launch(K.repack_q5_0_q8_0, a.size * 8, a, out)
    return out


def _drop_pages(a: np.ndarray) -> None:
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    start = a.ctypes.data
    lo, hi = -(-start // page) * page, (start + a.nbytes) // page * page  # whole pages inside `a` only
    if hi > lo:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), ctypes.c_int(mmap.MADV_DONTNEED))


_warm_lock = threading.Lock()
_warm: set[int] = set()  # what is warmed: tile kind groups (their masks), or 0 for the GGUF-block kernels
_groups_used: set[int] = set()  # the tile kind groups of every tiled weight made in this process


def warmup(groups: Iterable[int] = ()) -> None:
    """Compile (or load from numba's cache) the kernels the current layouts use, so no request pays
    a JIT: the tile kernels of each kind group a tiled weight of this process holds (so call it after
    the model is loaded; the types without GGUF-block kernels are tiled even under FAK_TILES=0) and of
    `groups` (tiles.KIND_GROUPS masks); the GGUF-block ones under FAK_TILES=0 only (else they compile
    on first use)."""
    tiled = resident_layout("Q8_0").endswith(TILED)
    with _warm_lock:
        for group in sorted((_groups_used | set(groups)) - _warm):
            kind = (group & -group).bit_length() - 1  # the group's first kind
            src = np.zeros((1, L.GGUF_BYTES[kind]), np.uint8)
            src.setflags(write=False)  # memmapped weights are read-only: their own specialization
            tiles = np.zeros(L.tiled_shape(kind, 1, L.SB_VALUES[kind]), np.uint8)
            L.repack_tiles(kind, src, tiles)
            tiles.setflags(write=False)
            x = np.zeros((1, L.SB_VALUES[kind]), np.float32)
            with warming():  # both the parallel kernel and its serial twin
                launch(T.gemm_for(kind), 0, kind, tiles, x, np.empty((1, 1), np.float32))
            T.dq_rows_for(kind)(kind, tiles, np.zeros(1, np.int64), np.empty((1, L.SB_VALUES[kind]), np.float32))
            _warm.add(group)
        if not tiled and 0 not in _warm:
            for kind in K.KIND:
                bs, bb = K.BLOCK_SIZE[kind], K.BLOCK_BYTES[kind]
                raw = np.zeros((2, (256 // bs) * bb), dtype=np.uint8)
                raw.setflags(write=False)  # QuantWeight always holds a read-only view
                x = np.zeros((1, 256), dtype=np.float32)
                with warming():
                    launch(gemm, 0, raw, x, np.empty((1, 2), dtype=np.float32), K.F16_LUT, K.KIND[kind])
                    launch(DQ_ROWS[kind], 0, raw, np.zeros(1, np.int64), np.empty((1, 256), np.float32), K.F16_LUT,
                           K.QK)
            src = np.zeros((1, 22), np.uint8)
            with warming():
                launch(K.repack_q5_0_q8_0, 0, src, np.empty((1, 34), np.uint8))
                src.setflags(write=False)
                launch(K.repack_q5_0_q8_0, 0, src, np.empty((1, 34), np.uint8))
            _warm.add(0)
