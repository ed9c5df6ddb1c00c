"""Link throughput: a P/D delivery (logits + a KV frame) over a worker link, plain vs MAC vs encrypted.

    python bench/link_seal.py [--mib 64] [--reps 20]   (also the last table of bench/pd_transfer.py)

Two processes on this host (the sender a child, so both ends have a core), one Channel between them over
TCP loopback, as a prefill worker sends to a decode worker: plain (no key), MAC (the default with a cluster
key: AES-256-GCM tag over every byte, engine/wire/secure.py) and encrypted (`--link-encrypt`). Prints GB/s
for each, in one run, and each one's ratio to plain (the target for MAC is >= 0.8x).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KEY = "bench cluster key, long enough to be one"


def _sender(port: int, mode: str, mib: int, reps: int) -> None:
    from engine.wire.channel import Channel
    from engine.wire.secure import LinkKey

    key = None if mode == "plain" else LinkKey.of(KEY, encrypt=mode == "encrypted")
    ch = Channel.connect("127.0.0.1", port, key=key)
    frame = np.random.default_rng(0).integers(0, 255, size=mib << 20, dtype=np.uint8)
    logits = np.zeros(262_144, np.float32)
    for i in range(reps + 1):  # the first is a warm-up (buffers grown, pages touched)
        ch.send({"op": "deliver", "i": i}, logits, frame)
    ch.recv(60)  # the receiver's "done"
    ch.close()


def run(mode: str, mib: int, reps: int) -> float:
    from engine.wire.channel import Channel
    from engine.wire.secure import LinkKey

    lst = socket.create_server(("127.0.0.1", 0))
    p = mp.get_context("spawn").Process(target=_sender, args=(lst.getsockname()[1], mode, mib, reps))
    p.start()
    sock, _ = lst.accept()
    key = None if mode == "plain" else LinkKey.of(KEY)
    ch = Channel.accept(sock, "sender", key)
    ch.recv(60)
    t0 = time.perf_counter()
    n = 0
    for _ in range(reps):
        _, blobs = ch.recv(60)
        n += sum(len(b) for b in blobs)
    dt = time.perf_counter() - t0
    ch.send({"op": "done"})
    p.join(30)
    ch.close()
    lst.close()
    return n / dt / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="KV frame size per delivery (MiB)")
    ap.add_argument("--reps", type=int, default=20, help="deliveries timed per mode")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of all modes, interleaved; the best is kept")
    a = ap.parse_args()
    report(measure(a.mib, a.reps, a.rounds), a.mib, a.reps, a.rounds)


MODES = ("plain", "mac", "encrypted")


def measure(mib: int, reps: int, rounds: int) -> dict[str, float]:
    best = dict.fromkeys(MODES, 0.0)
    for _ in range(rounds):  # interleaved: a noisy moment hits every mode alike
        for m in MODES:
            best[m] = max(best[m], run(m, mib, reps))
    return best


def report(best: dict[str, float], mib: int, reps: int, rounds: int) -> None:
    print(f"P/D delivery over a worker link (engine/wire/channel.py), {mib} MiB frames x {reps}, TCP loopback, "
          f"best of {rounds}")
    print(f"{'link':<11}{'GB/s':>8}{'vs plain':>10}")
    for m in MODES:
        print(f"{m:<11}{best[m]:>8.2f}{best[m] / best['plain']:>9.2f}x")


if __name__ == "__main__":
    main()
