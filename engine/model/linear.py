"""Every weight product goes through here: plain float32 [out, in] arrays or resident quantized objects.

Decode (`matmul`) must give each row a result that does not depend on how many rows are batched,
so step_batch is bit-identical to serial steps: a numba kernel with a fixed accumulation order per
output element, parallel over output rows (each weight row is read once for all lanes). Prefill
(`matmul_prefill`) is compute bound and uses BLAS.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, prange

from engine.kernels.blockdot import dot_f32
from engine.kernels.parallel import launch
from engine.model.scratch import Scratch


@njit(parallel=True, nogil=True, cache=True)
def _rows_kernel(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - numba
    """out[b, o] = x[b] . w[o], each dot in one fixed order (blockdot.dot_f32), so the result is the
    same bits whichever compilation (serial twin or parallel kernel) runs it."""
    b_rows, n = x.shape
    if w.shape[1] != n or x.strides[1] != 4 or w.strides[1] != 4 or out.shape[0] != b_rows or out.shape[1] != w.shape[0]:
        raise ValueError("matmul_rows: shapes do not match")  # dot_f32 reads raw addresses
    xa, wa = np.uint64(x.ctypes.data), np.uint64(w.ctypes.data)
    xs, ws = np.uint64(x.strides[0]), np.uint64(w.strides[0])
    for o in prange(w.shape[0]):
        for b in range(b_rows):
            out[b, o] = dot_f32(xa + np.uint64(b) * xs, wa + np.uint64(o) * ws, n)


def matmul_rows(x: np.ndarray, w: np.ndarray, out: Scratch | None = None) -> np.ndarray:
    """x [B, in] @ w[out, in].T with a per-row result independent of B (the reference-stable path)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = out.take(x.shape[0], w.shape[0]) if out is not None else np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    launch(_rows_kernel, x.shape[0] * w.shape[0] * w.shape[1], x, w, y)
    return y


def is_plain(w: Any) -> bool:
    return isinstance(w, np.ndarray)


def matmul(x: np.ndarray, w: Any, out: Scratch | None = None) -> np.ndarray:
    """Decode product: f32[B, in] -> f32[B, out], deterministic per row (into `out`'s buffer when given)."""
    if isinstance(w, np.ndarray):
        return matmul_rows(x, w, out)
    return w.matmul(np.asarray(x), out)  # QuantWeight.matmul converts what is not float32 rows already


def matmul_prefill(x: np.ndarray, w: Any) -> np.ndarray:
    """Prefill product (may use BLAS; rows may differ from `matmul` in the last bits)."""
    if isinstance(w, np.ndarray):
        return np.ascontiguousarray(x, dtype=np.float32) @ w.T
    return w.matmul_prefill(np.ascontiguousarray(x, dtype=np.float32))


def take(w: Any, ids: np.ndarray) -> np.ndarray:
    """Embedding rows for token ids: f32[len(ids), in]."""
    if isinstance(w, np.ndarray):
        return w[ids].astype(np.float32, copy=True)
    return np.asarray(w.take(ids), dtype=np.float32)
