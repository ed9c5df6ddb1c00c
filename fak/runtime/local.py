"""LocalWorkers: the `fak worker` processes `fak serve --pd P:D` starts on this host, and their end.

The cores are split by CPU affinity and numba/BLAS thread counts (split_cores): with enough of them the
prefill worker gets half and the decode workers the rest; with fewer, each decode worker gets its own
core and the prefill runs on all of them at a lower priority. Either way a long prefill cannot take a
core a decode step is waiting for. Each child
reads its stdin and exits when it closes: a head that dies, even by SIGKILL, takes its workers with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fak.errors import FakError


def split_cores(cpus: list[int], n_decode: int) -> tuple[list[int], list[list[int]], bool]:
    """The prefill worker's cores, each decode worker's, and whether the prefill runs in the background.

    With a core for the prefill and one per decode worker, the prefill gets half of the cores and the decode
    workers share out the rest. With fewer (2 cores, `--pd 1:2`), decode latency wins: each decode worker
    gets a core of its own and the prefill may use every core at a lower priority (nice 10), so it runs on
    what the decode steps leave instead of time-slicing against them."""
    if len(cpus) < 2:
        return cpus, [cpus] * n_decode, False
    if len(cpus) < n_decode + 1:
        return cpus, [[cpus[i % len(cpus)]] for i in range(n_decode)], True
    k = -(-len(cpus) // 2) if len(cpus) - -(-len(cpus) // 2) >= n_decode else len(cpus) - n_decode
    pre, rest = cpus[:k], cpus[k:]
    per = len(rest) // n_decode
    return pre, [rest[i * per : (i + 1) * per] for i in range(n_decode)], False


@dataclass
class Worker:
    role: str
    name: str
    address: str
    proc: subprocess.Popen[str]
    cpus: list[int] = field(default_factory=list)


def _cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


class LocalWorkers:
    """`fak serve --pd 1:N`'s workers: one prefill, N decode."""

    def __init__(self, model: str, n_decode: int, *, worker_argv: list[str], plain: bool = False,
                 sched_args: list[str] | None = None,
                 prefill_chunk: int = 64, ready_timeout: float = 300.0, cpus: list[int] | None = None,
                 env: dict[str, str] | None = None) -> None:  # env: e.g. the cluster key (fak.runtime.topology)
        pre, dec, background = split_cores(cpus if cpus is not None else _cpus(), n_decode)
        extra = [*(sched_args or []), "--prefill-chunk", str(prefill_chunk)]
        self.nice = {"prefill-0": 10} if background else {}
        self._launch([("prefill", "prefill-0", pre, extra)] +
                     [("decode", f"decode-{i}", c, extra) for i, c in enumerate(dec)], worker_argv, model, plain,
                     ready_timeout, env)

    def _launch(self, plan: list[tuple[str, str, list[int], list[str]]], argv: list[str], model: str, plain: bool,
                ready_timeout: float, env: dict[str, str] | None) -> None:
        self.workers: list[Worker] = []
        procs: list[subprocess.Popen[str]] = []
        try:
            for role, name, c, args in plan:
                procs.append(self._spawn(argv, role, name, model, plain, args, c, env, getattr(self, "nice", {}).get(name, 0)))
            for (role, name, c, _), proc in zip(plan, procs, strict=False):
                self.workers.append(Worker(role, name, self._ready(proc, name, ready_timeout), proc, c))
        except BaseException:
            self.close()
            for p in procs:
                p.kill()
            raise

    @staticmethod
    def _spawn(argv: list[str], role: str, name: str, model: str, plain: bool, args: list[str], cpus: list[int],
               env: dict[str, str] | None, nice: int = 0) -> subprocess.Popen[str]:
        n = str(max(1, len(cpus)))
        child_env = {**os.environ, **(env or {}), "NUMBA_NUM_THREADS": n, "OMP_NUM_THREADS": n,
                     "OPENBLAS_NUM_THREADS": n, "MKL_NUM_THREADS": n}
        # argv: the caller's command for `fak worker` (commands/ knows how it is run; this layer does not)
        cmd = [*argv, "--role", role, "--name", name, "--listen",
               "127.0.0.1:0", "--gguf", model, "--exit-with-parent", *(["--plain"] if plain else []), *args]
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=child_env)
        if hasattr(os, "sched_setaffinity") and cpus:
            try:
                os.sched_setaffinity(proc.pid, cpus)  # before it starts any thread: they inherit it
            except OSError:
                pass
        if nice:
            try:
                os.setpriority(os.PRIO_PROCESS, proc.pid, nice)  # likewise inherited by its threads
            except OSError:
                pass
        # stderr drains all along (a full pipe would block the worker); its last lines explain a failed start
        tail: deque[str] = deque(maxlen=20)
        proc.stderr_tail = tail  # type: ignore[attr-defined]
        threading.Thread(target=lambda: tail.extend(proc.stderr) if proc.stderr else None, daemon=True).start()
        return proc

    @staticmethod
    def _ready(proc: subprocess.Popen[str], name: str, timeout: float) -> str:
        box: list[Any] = []
        t = threading.Thread(target=lambda: box.append(proc.stdout.readline() if proc.stdout else ""), daemon=True)
        t.start()
        t.join(timeout)
        line = box[0] if box else ""
        try:
            msg = json.loads(line) if line else {}
        except ValueError:
            msg = {}
        if msg.get("fak_worker") != "ready":
            proc.kill()
            proc.wait(10)
            time.sleep(0.1)  # the drain thread reads what the worker said last
            err = [x.strip() for x in proc.stderr_tail if x.strip()]  # type: ignore[attr-defined]
            why = err[-1] if err else (f"no ready line within {timeout:.0f} s" if not box else "it exited")
            raise FakError(f"P/D worker {name} did not start: {why}")
        return str(msg["address"])

    @property
    def prefill(self) -> Worker:
        return next(w for w in self.workers if w.role == "prefill")

    @property
    def decoders(self) -> list[Worker]:
        return [w for w in self.workers if w.role == "decode"]

    def kill(self, name: str) -> None:
        """SIGKILL one worker (tests: a decode worker dying mid-stream)."""
        w = next(w for w in self.workers if w.name == name)
        w.proc.kill()
        w.proc.wait(10)

    def close(self, timeout: float = 10.0) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.terminate()
        deadline = time.monotonic() + timeout
        for w in self.workers:
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait(5)
            for f in (w.proc.stdin, w.proc.stdout):
                if f is not None:
                    try:
                        f.close()
                    except OSError:
                        pass


class LocalStages(LocalWorkers):
    """`fak serve --stages N`'s workers: one `fak worker --role stage` per band, the cores split evenly."""

    def __init__(self, model: str, bands: list[tuple[int, int]], *, worker_argv: list[str], plain: bool = False,
                 ready_timeout: float = 300.0,
                 cpus: list[int] | None = None, env: dict[str, str] | None = None) -> None:
        cpus = cpus if cpus is not None else _cpus()
        n = len(bands)
        per = max(1, len(cpus) // n)
        shares = [cpus[i * per : (i + 1) * per] if len(cpus) >= n else cpus for i in range(n)]
        self._launch([("stage", f"stage-{i}", shares[i], ["--layers", f"{lo}:{hi}"])
                      for i, (lo, hi) in enumerate(bands)], worker_argv, model, plain, ready_timeout, env)

    @property
    def addresses(self) -> list[str]:
        return [w.address for w in self.workers]
