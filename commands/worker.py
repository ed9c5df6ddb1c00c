"""`fak worker --role prefill|decode --listen HOST:PORT`: one P/D worker process (engine/pd nodes).

A head (`fak serve --pd-workers URL,...`, or `fak serve --pd P:D`, which starts these itself) connects,
checks the model identity and drives it. When ready the worker prints one JSON line on stdout
({"fak_worker": "ready", "role": ..., "address": "HOST:PORT"}) for whoever started it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

import typer

from commands import sched_flags

# how this process's own CLI runs `fak worker` (fak/runtime/local.py spawns what it is given)
WORKER_ARGV = [sys.executable, "-m", f"{__package__}.main", "worker"]


def register(app: typer.Typer) -> None:
    @app.command("worker")
    def worker(
        role: str = typer.Option(..., "--role", help="prefill | decode | stage."),
        layers: str | None = typer.Option(None, "--layers", help="stage: the band of layers LO:HI it runs."),
        listen: str = typer.Option("127.0.0.1:0", "--listen", help="HOST:PORT to listen on (port 0: a free one)."),
        gguf: str | None = typer.Option(None, "--gguf", help="GGUF path or alias (default $FAK_MODEL or gemma3-270m)."),
        plain: bool = typer.Option(False, "--plain", help="float32 weights (default: quantized blocks resident)."),
        name: str | None = typer.Option(None, "--name", help="Worker name in stats (default: ROLE-PORT)."),
        threads: int = typer.Option(0, "--threads", help="numba threads for this worker (0: numba's default)."),
        prefill_chunk: int = typer.Option(64, "--prefill-chunk", help="Prefill chunk tokens (must match the head's)."),
        max_running: int | None = sched_flags.MAX_RUNNING,
        kv_blocks: int | None = sched_flags.KV_BLOCKS,
        block_tokens: int | None = sched_flags.BLOCK_TOKENS,
        preempt: str | None = sched_flags.PREEMPT,
        victim: str | None = sched_flags.VICTIM,
        kv_dtype: str | None = sched_flags.KV_DTYPE,
        shm_mb: int = typer.Option(256, "--shm-mb", help="decode: shared-memory ring size per prefill link (MiB)."),
        key: str | None = sched_flags.KEY,
        link_encrypt: bool = sched_flags.LINK_ENCRYPT,
        exit_with_parent: bool = typer.Option(False, "--exit-with-parent", help="Exit when stdin closes (the "
                                              "process that started this one is gone)."),
    ) -> None:
        """Serve one prefill or decode worker for a P/D head."""
        from engine.wire.channel import parse_address
        from fak.errors import FakError
        from fak.runtime.boot import SchedOptions, boot
        from fak.runtime.nodes import ROLES, build_node

        if role not in ROLES:
            raise FakError(f"--role {role!r}: expected one of {', '.join(ROLES)}")
        try:
            host, port = parse_address(listen, "--listen")
        except ValueError as e:
            raise FakError(str(e)) from None
        band = _band(role, layers)
        if threads < 0:
            raise FakError(f"--threads {threads}: expected a non-negative integer")
        if shm_mb < 1:
            raise FakError(f"--shm-mb {shm_mb}: expected a positive integer")
        sched = SchedOptions.resolve(max_running=max_running, kv_blocks=kv_blocks, block_tokens=block_tokens,
                                     preempt=preempt, victim=victim, kv_dtype=kv_dtype)
        if threads:
            import numba

            numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        link = sched_flags.link_flags(key, link_encrypt)
        if not link["key"] and host not in ("127.0.0.1", "localhost", "::1"):
            raise FakError(f"--listen {listen}: listening beyond loopback needs the cluster key (--key or FAK_PD_KEY, "
                           "the same on every worker and head): without it anyone who reaches the port drives "
                           "this worker")
        b = boot(gguf, resident=not plain, sched=sched, show=False, scheduler=False)
        node = build_node(role, b, name=name, host=host, port=port, layers=band, prefill_chunk=prefill_chunk,
                          shm_bytes=shm_mb << 20, **link, **sched.as_kwargs())
        address = f"{node.address[0]}:{node.address[1]}"
        print(json.dumps({"fak_worker": "ready", "role": role, "name": node.name, "address": address,
                          "pid": os.getpid()}), flush=True)
        print(f"fak worker: {role} {node.name} on {address} · {b.boot_line()}", file=sys.stderr, flush=True)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        if exit_with_parent:
            threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
        threading.Thread(target=lambda: (node._stop.wait(), stop.set()), daemon=True).start()
        stop.wait()
        node.close()


def _band(role: str, layers: str | None) -> tuple[int, int] | None:
    from fak.errors import FakError

    if role != "stage":
        if layers is not None:
            raise FakError("--layers is for --role stage")
        return None
    lo, sep, hi = (layers or "").partition(":")
    if not sep or not lo.strip().isdigit() or not hi.strip().isdigit():
        raise FakError(f"--layers {layers!r}: expected LO:HI, e.g. 0:9 (a stage worker needs its band)")
    return int(lo), int(hi)
