"""Inside the sandbox: pid 1, and the network's only way out. Run by bwrap as a script (`python -I -S
relay.py --listen PORT=SOCKET ... -- COMMAND...`), so it imports the standard library only.

- Listens on 127.0.0.1:PORT (the sandbox's own loopback: its network namespace has nothing else) and
  relays every connection to the unix socket SOCKET, bound in from outside: the guard's gateway (the agent's
  base URL stays http://127.0.0.1:PORT) and the allow-list proxy (HTTPS_PROXY). The listeners are bound
  before COMMAND starts, so its first request never races them.
- Runs COMMAND with the default signal dispositions and mask, reaps every orphan (it is init), and exits
  with COMMAND's status (128+N for signal N). Its exit ends the pid namespace: whatever COMMAND left
  running in the background dies with it.
- Signals: a signal sent by a process (the guard forwarding `kill -TERM <guard>`) is passed to COMMAND;
  one the terminal generated (Ctrl-C) already reached COMMAND, which shares the terminal's foreground
  group, and is not sent twice.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import threading

FORWARD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
CHUNK = 65536


def parse(argv: list[str]) -> tuple[list[tuple[int, str]], list[str]]:
    listens: list[tuple[int, str]] = []
    i = 0
    while i < len(argv) and argv[i] != "--":
        if argv[i] != "--listen" or i + 1 >= len(argv) or "=" not in argv[i + 1]:
            raise SystemExit(f"fak relay: usage: relay.py --listen PORT=SOCKET ... -- COMMAND (got {argv[i]!r})")
        port, path = argv[i + 1].split("=", 1)
        listens.append((int(port), path))
        i += 2
    command = argv[i + 1:]
    if not command:
        raise SystemExit("fak relay: no command after --")
    return listens, command


async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Copy src to dst until EOF (the proxy's tunnels use it too: this module stays standard library only)."""
    try:
        while data := await src.read(CHUNK):
            dst.write(data)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()  # a half-close passes through (a client that shut its write side)
    except (ConnectionError, OSError):
        pass


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> None:
    try:
        up_r, up_w = await asyncio.open_unix_connection(path)
    except OSError:
        writer.close()
        return
    try:
        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))
    finally:
        for w in (up_w, writer):
            w.close()


def _serve(socks: list[tuple[socket.socket, str]], ready: threading.Event) -> None:
    async def main() -> None:
        for sock, path in socks:
            await asyncio.start_server(lambda r, w, p=path: _handle(r, w, p), sock=sock)
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def _forward(pid: int) -> None:
    while True:
        info = signal.sigwaitinfo(FORWARD)
        if info.si_code > 0:  # the terminal's (SI_KERNEL): the command has it already
            continue
        try:
            os.kill(pid, info.si_signo)
        except ProcessLookupError:
            return


def main(argv: list[str]) -> int:
    listens, command = parse(argv)
    socks = []
    for port, path in listens:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.bind(("127.0.0.1", port))
        s.listen(128)
        socks.append((s, path))
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARD)  # before any thread: only the forwarder takes them
    ready = threading.Event()
    if socks:
        threading.Thread(target=_serve, args=(socks, ready), name="fak-relay", daemon=True).start()
        ready.wait(10)
    reset = (*FORWARD, signal.SIGPIPE, signal.SIGXFSZ)  # the command starts as from a shell, not as Python left them
    try:
        pid = os.posix_spawnp(command[0], command, os.environ, setsigmask=(), setsigdef=reset)
    except OSError as exc:
        sys.stderr.write(f"fak sandbox: {command[0]}: {exc.strerror or exc}\n")
        return 127
    threading.Thread(target=_forward, args=(pid,), name="fak-relay-signals", daemon=True).start()
    while True:  # init's job: reap every child, ours last
        try:
            got, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue
        if got == pid:
            rc = os.waitstatus_to_exitcode(status)
            return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)  # no interpreter teardown with relay threads still running
