"""The agent as a child process that owns the terminal: stdin/stdout/stderr inherited, signals
forwarded, its exit status returned (128+N when a signal N ended it, as a shell reports it).

Signals: the guard blocks the forwarded set in every thread (`block_signals`, called before any
thread starts) and one thread takes them with sigwaitinfo, which says who sent each. A signal the
terminal generated (Ctrl-C, Ctrl-\\, hangup: si_code SI_KERNEL) already reached the agent, which is
in the terminal's foreground process group with us, so it is not sent twice (Claude Code exits on a
second Ctrl-C); one another process sent (`kill -INT <guard>`, si_code <= 0) is forwarded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading

from fak.errors import FakError

FORWARD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def block_signals() -> None:
    """Block the forwarded signals in this thread and every thread started after it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARD)


def _unblock() -> None:  # in the child, between fork and exec: the agent gets the default mask
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARD)


def run(argv: list[str], env: dict[str, str]) -> int:
    """Run the agent to completion; its exit code (128+N if killed by signal N)."""
    try:
        # Popen restores the signal dispositions Python changed (SIGPIPE...); the mask is ours to undo
        proc = subprocess.Popen(argv, env=env, preexec_fn=_unblock)  # noqa: PLW1509 (only a sigmask call)
    except FileNotFoundError:
        raise FakError(f"{argv[0]}: command not found") from None
    except PermissionError:
        raise FakError(f"{argv[0]}: permission denied") from None
    except OSError as exc:
        raise FakError(f"{argv[0]}: cannot start: {exc.strerror or exc}") from None
    threading.Thread(target=_forward, args=(proc,), name="fak-guard-signals", daemon=True).start()
    rc = proc.wait()
    return 128 - rc if rc < 0 else rc


def _forward(proc: subprocess.Popen[bytes]) -> None:
    while proc.poll() is None:
        info = signal.sigwaitinfo(FORWARD)
        if info.si_code > 0 or info.si_pid == proc.pid:  # from the terminal (the agent has it) or from the agent
            continue
        try:
            os.kill(proc.pid, info.si_signo)
        except ProcessLookupError:
            return
