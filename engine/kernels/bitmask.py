"""Token bitmasks on a logits row: bit j of 32-bit word j // 32 set = token j allowed.

The layout grammar libraries fill (llguidance, xgrammar, outlines-core). `mask_logits` writes -inf into
the disallowed entries in place, one serial pass (a row is masked on the scheduler's loop thread, between
two forwards: no OpenMP team). Words that are all ones are skipped, so a mask inside a JSON string
(nearly every token allowed) costs a scan of vocab / 32 words; a structural position (a few tokens
allowed) writes the whole row. `mask_logits_ref` is the numpy reference.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def _mask(z: np.ndarray, words: np.ndarray) -> int:  # pragma: no cover - numba
    n = z.shape[0]
    ninf = np.float32(-np.inf)
    allowed = 0
    for w in range(min(words.shape[0], (n + 31) // 32)):
        v = np.uint32(words[w])
        base = w * 32
        top = min(base + 32, n)
        if v == np.uint32(0xFFFFFFFF):
            allowed += top - base
        elif v == np.uint32(0):
            z[base:top] = ninf
        else:
            for j in range(base, top):
                if (v >> np.uint32(j - base)) & np.uint32(1):
                    allowed += 1
                else:
                    z[j] = ninf
    for j in range(min(words.shape[0] * 32, n), n):  # beyond the mask: not allowed
        z[j] = ninf
    return allowed


def mask_logits(z: np.ndarray, words: np.ndarray) -> int:
    """Set z[j] = -inf (in place) for every token j whose bit is clear; returns how many are allowed.
    z: float32 [vocab] contiguous; words: int32 [ceil(vocab / 32)]."""
    if z.dtype != np.float32 or z.ndim != 1 or not z.flags.c_contiguous:
        raise ValueError("mask_logits: z must be a contiguous float32 row")
    if words.dtype != np.int32 or words.ndim != 1:
        raise ValueError("mask_logits: words must be an int32 vector")
    return int(_mask(z, words))


def mask_logits_ref(z: np.ndarray, words: np.ndarray) -> np.ndarray:
    bits = np.unpackbits(words.view(np.uint8), bitorder="little").astype(bool)
    keep = np.zeros(z.shape[0], dtype=bool)
    keep[: min(bits.size, z.shape[0])] = bits[: z.shape[0]]
    return np.where(keep, z, np.float32(-np.inf))


def warmup() -> None:
    """Load (or compile, the first time) the kernel, so no request pays for it."""
    mask_logits(np.zeros(40, np.float32), np.array([-1, 5], np.int32))
