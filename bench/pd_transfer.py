"""KV transfer throughput: export, import and each transport (inproc, shm, tcp) against a plain memcpy.

    python bench/pd_transfer.py [--min-mb 400] [--shape gemma3-270m|synthetic] [--links-only]

Then the worker link itself (bench/link_seal.py): a delivery over a Channel plain, MAC (the default with a
cluster key) and encrypted (--link-encrypt), GB/s and the ratio to plain, in the same run.

Payloads: the KV frame of a 256- and a 2048-token prompt in the chosen model's pool shape (Gemma 3 270M:
18 layers, 1 KV head of 256, float32, 16-token blocks: 36 KiB per token), and a raw 64 MiB frame.
export = gather from the pool into a reused frame buffer + checksum; import = validate (checksum, identity,
layout, seal) + allocate + scatter into a pool. Each transport is timed end to end as a decode worker would use it:
the sender sends the frame, the
receiver receives it and copies it out of the transport's buffer into its own memory (the copy an
import does anyway), repeated until --min-mb have moved. shm and tcp run the sender in a second process
(spawn), the receiver here; tcp over 127.0.0.1. `memcpy` is numpy copyto of the same bytes.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.model.kv import BlockPool
from engine.wire import (
    Descriptor,
    ShmReceiver,
    ShmSender,
    TcpReceiver,
    TcpSender,
    inproc_pair,
)
from engine.wire.blocks import export_blocks, import_blocks

SHAPES = {"gemma3-270m": (18, 1, 256), "synthetic": (3, 2, 16)}  # layers, kv heads, head dim
BT = 16
IDENTITY = bytes(range(32))


def _frame(shape: tuple[int, int, int], tokens: int) -> tuple[bytearray, BlockPool, list[int]]:
    layers, heads, dim = shape
    nb = -(-tokens // BT)
    pool = BlockPool(layers, heads, dim, num_blocks=nb, block_tokens=BT)
    rng = np.random.default_rng(0)
    pool.k[...] = rng.standard_normal(pool.k.shape, dtype=np.float32)
    pool.v[...] = rng.standard_normal(pool.v.shape, dtype=np.float32)
    ids = [pool.allocate() for _ in range(nb)]
    frame = export_blocks(pool, ids, list(range(1, nb + 1)), [i * BT for i in range(nb)],
                          Descriptor("bench", False, "allow"), IDENTITY, last_fill=tokens - (nb - 1) * BT)
    return frame, pool, ids


def _reps(nbytes: int, min_mb: int) -> int:
    return max(3, -(-(min_mb << 20) // nbytes))


def _best(fn: Callable[[], Any], reps: int) -> float:
    """Seconds of the fastest of `reps` calls (after one warm call)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _sender(kind: str, where: Any, nbytes: int, reps: int, ready: Any, go: Any) -> None:
    frame = np.random.default_rng(1).integers(0, 256, nbytes, dtype=np.uint8)
    tx: Any = ShmSender(where) if kind == "shm" else TcpSender("127.0.0.1", where)
    ready.set()
    go.wait(60)
    for _ in range(reps + 1):  # +1: the receiver's warm-up frame
        tx.send(frame, timeout=120)
    tx.close()


def _cross_process(kind: str, nbytes: int, reps: int) -> float:
    """GB/s of `reps` frames of nbytes from a spawned sender into this process (received + copied out)."""
    ctx = mp.get_context("spawn")
    rx: Any = ShmReceiver(2 * nbytes + (1 << 20)) if kind == "shm" else TcpReceiver()
    where = rx.name if kind == "shm" else rx.address[1]
    ready, go = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_sender, args=(kind, where, nbytes, reps, ready, go))
    p.start()
    ready.wait(60)
    dst = np.empty(nbytes, dtype=np.uint8)
    go.set()
    np.copyto(dst, np.frombuffer(rx.recv(timeout=120), dtype=np.uint8))  # warm-up (tcp: accept, buffer growth)
    t = time.perf_counter()
    for _ in range(reps):
        np.copyto(dst, np.frombuffer(rx.recv(timeout=120), dtype=np.uint8))
    dt = time.perf_counter() - t
    p.join(60)
    rx.close()
    return reps * nbytes / dt / 1e9


def _inproc(frame: np.ndarray, reps: int) -> float:
    tx, rx = inproc_pair()
    dst = np.empty_like(frame)

    def once() -> None:
        tx.send(frame)
        np.copyto(dst, np.frombuffer(rx.recv(timeout=10), dtype=np.uint8))

    return frame.nbytes / _best(once, reps) / 1e9


def _cell(g: float) -> str:
    return f"{'-':>8}" if math.isnan(g) else f"{g:>8.2f}"  # nan: a raw payload, no KV frame to export


def _measure(shape: tuple[int, int, int], tokens: int | None, min_mb: int) -> tuple[float, ...]:
    """(frame bytes, memcpy, export, import, inproc, shm, tcp GB/s) of one payload."""
    if tokens is None:
        raw = np.random.default_rng(2).integers(0, 256, 64 << 20, dtype=np.uint8)
        export_gbps = import_gbps = float("nan")
    else:
        frame, pool, ids = _frame(shape, tokens)
        raw = np.frombuffer(frame, dtype=np.uint8)
        reps = _reps(raw.nbytes, min_mb)
        dst_pool = BlockPool(*shape, num_blocks=len(ids), block_tokens=BT)
        out = bytearray(len(frame))  # a worker builds its frames in one reused buffer
        hashes, positions = list(range(len(ids))), [i * BT for i in range(len(ids))]
        desc = Descriptor("bench", False, "allow")

        def imp() -> None:
            for b in import_blocks(dst_pool, frame, IDENTITY):
                dst_pool.release(b)

        export_gbps = raw.nbytes / _best(lambda: export_blocks(pool, ids, hashes, positions, desc, IDENTITY, out=out),
                                         reps) / 1e9
        import_gbps = raw.nbytes / _best(imp, reps) / 1e9
    n = raw.nbytes
    reps = _reps(n, min_mb)
    dst = np.empty_like(raw)
    memcpy = n / _best(lambda: np.copyto(dst, raw), reps) / 1e9
    return (n, memcpy, export_gbps, import_gbps, _inproc(raw, reps), _cross_process("shm", n, reps),
            _cross_process("tcp", n, reps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--min-mb", type=int, default=400, help="bytes moved per measurement (MiB)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="gemma3-270m")
    ap.add_argument("--links-only", action="store_true", help="only the plain / MAC / encrypted link table")
    a = ap.parse_args()
    if not a.links_only:
        transports(a)
    print()
    import link_seal

    link_seal.report(link_seal.measure(mib=64, reps=10, rounds=3), 64, 10, 3)


def transports(a: argparse.Namespace) -> None:
    shape = SHAPES[a.shape]
    payloads: list[tuple[str, int | None]] = [(f"{a.shape} KV, 256 tok", 256), (f"{a.shape} KV, 2048 tok", 2048),
                                              ("raw 64 MiB", None)]
    rows = [(label, *_measure(shape, tokens, a.min_mb)) for label, tokens in payloads]
    print(f"KV transfer throughput, GB/s (10^9 B/s); {os.cpu_count()} cores; ratio = transport / memcpy\n")
    head = f"{'payload':<26}{'frame MB':>9}{'memcpy':>8}{'export':>8}{'import':>8}{'inproc':>14}{'shm':>14}{'tcp':>14}"
    print(head)
    print("-" * len(head))
    for label, n, memcpy, ex, im, inproc, shm, tcp in rows:
        cells = "".join(f"{g:>7.2f} ({g / memcpy:4.2f})" for g in (inproc, shm, tcp))
        print(f"{label:<26}{n / 1e6:>9.1f}{memcpy:>8.2f}{_cell(ex)}{_cell(im)}{cells}")


if __name__ == "__main__":
    main()
