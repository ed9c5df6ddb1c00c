"""Scratch: one float32 buffer a loop reuses for an output it makes every step (the LM head's logits).

Why: a step's logits are rows x vocabulary floats, 20-60 MB when 16 lanes verify drafts (Qwen 2.5's
151,936 tokens a row). A fresh array of that size every step is past malloc's mmap threshold (32 MB at
most): it was mapped, every page faulted in and zeroed, then unmapped, the unmapping's TLB shootdown
stopping numba's workers too. 16 lanes of bench/spec.py's edit workload ran 5% slower under speculation
for it (off, at 16 rows a step, under the threshold, did not move).

The owner says how long a view lives: the scheduler's loop uses a step's logits within that step.
"""

from __future__ import annotations

import numpy as np


class Scratch:
    def __init__(self) -> None:
        self._buf = np.empty(0, dtype=np.float32)

    def take(self, rows: int, cols: int) -> np.ndarray:
        """A C-contiguous float32 [rows, cols] view of the buffer (grown by half again at least when short,
        so a step's rows rising one by one do not reallocate it each time): it holds what the last `take`
        wrote until the next one."""
        n = rows * cols
        if self._buf.size < n:
            self._buf = np.empty(max(n, self._buf.size * 3 // 2), dtype=np.float32)
        return self._buf[:n].reshape(rows, cols)

    @property
    def nbytes(self) -> int:
        return int(self._buf.nbytes)
