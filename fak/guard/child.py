"""The agent as a child process that owns the terminal: stdin/stdout/stderr inherited, signals
forwarded, its exit status returned (128+N when a signal N ended it, as a shell reports it).

Signals: the guard blocks the forwarded set in every thread (`block_signals`, called before any
thread starts) and one thread takes them with sigwaitinfo, which says who sent each. A signal the
terminal generated (Ctrl-C, Ctrl-\\, hangup: si_code SI_KERNEL) already reached the agent, which is
in the terminal's foreground process group with us, so it is not sent twice (Claude Code exits on a
second Ctrl-C); one another process sent (`kill -INT <guard>`, si_code <= 0) is forwarded.

In the sandbox (`box`) the child is bwrap, and everything inside dies with it (--die-with-parent), so
bwrap starts with the terminal's signals ignored (a Ctrl-C that killed bwrap would kill the agent
instead of reaching it), and a forwarded signal goes to the sandbox's init, the relay, which passes it
to the agent the same way.
"""

from __future__ import annotations

import os
import signal
import threading

from fak.errors import FakError
from fak.sandbox import Session

FORWARD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
TERMINAL = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)  # what a terminal sends its foreground group


def block_signals() -> None:
    """Block the forwarded signals in this thread and every thread started after it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARD)


def run(argv: list[str], env: dict[str, str], box: Session | None = None) -> int:
    """Run the agent to completion (inside `box`'s sandbox when given); its exit code (128+N if killed by
    signal N)."""
    # posix_spawn, not fork + a preexec_fn: other threads (the gateway) are running, and the child
    # must start with the default signal mask and dispositions (Python ignores SIGPIPE) without
    # running Python code between fork and exec
    reset = tuple(s for s in (getattr(signal, "SIGPIPE", None), getattr(signal, "SIGXFSZ", None)) if s is not None)
    name = argv[0]
    ignored: dict[int, object] = {}
    if box is not None:
        argv = box.wrap(argv)
        # ignored dispositions survive exec: set them for the spawn only (blocked here, they are only
        # discarded while ignored, a window of one system call)
        ignored = {s: signal.signal(s, signal.SIG_IGN) for s in TERMINAL}
    try:
        pid = os.posix_spawnp(argv[0], argv, env, setsigmask=(), setsigdef=reset)
    except FileNotFoundError:
        raise FakError(f"{name}: command not found") from None
    except PermissionError:
        raise FakError(f"{name}: permission denied") from None
    except OSError as exc:
        raise FakError(f"{name}: cannot start: {exc.strerror or exc}") from None
    finally:
        for s, handler in ignored.items():
            signal.signal(s, handler)  # type: ignore[arg-type]
    target = pid
    if box is not None:
        box.spawned()
        target = box.init_pid or pid
    done = threading.Event()
    threading.Thread(target=_forward, args=(target, done, pid), name="fak-guard-signals", daemon=True).start()
    _, status = os.waitpid(pid, 0)
    done.set()
    rc = os.waitstatus_to_exitcode(status)
    return 128 - rc if rc < 0 else rc


def _forward(pid: int, done: threading.Event, child: int) -> None:
    while not done.is_set():
        info = signal.sigwaitinfo(FORWARD)
        if done.is_set():
            return
        if info.si_code > 0 or info.si_pid in (pid, child):  # from the terminal (the agent has it) or the agent
            continue
        try:
            os.kill(pid, info.si_signo)
        except ProcessLookupError:
            return
