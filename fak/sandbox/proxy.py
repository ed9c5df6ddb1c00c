"""The allow-list proxy the guard runs outside the sandbox, on a unix socket bound into it (the relay
makes it HTTPS_PROXY / HTTP_PROXY = http://127.0.0.1:PORT inside). The sandbox has no other way out.

CONNECT host:port (HTTPS, any TLS: the proxy never sees inside it) and plain-HTTP absolute-URI requests
reach a host named by `--allow-net HOST` (`HOST` any port, `HOST:PORT` that port, `*.example.com` its
subdomains); everything else gets a 403 naming the reason, and is counted. An allowed name that resolves
to a loopback, link-local (the cloud metadata endpoint) or unspecified address is refused too, unless the
entry is that address itself: a name is not a way back into the host.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from fak.errors import FakError
from fak.sandbox.relay import pipe

log = logging.getLogger("fak.sandbox")
HEAD_LIMIT = 64 * 1024
HEAD_TIMEOUT = 30.0
CONNECT_TIMEOUT = 10.0


@dataclass(frozen=True)
class Entry:
    host: str  # lower-case; "*.example.com" matches subdomains only
    port: int | None  # None: any port

    def matches(self, host: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:])
        return host == self.host


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def split_hostport(text: str, default_port: int | None) -> tuple[str, int | None]:
    """"host", "host:443", "[::1]:443" -> (host, port); ValueError on a bad port."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, ""
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"bad port {port!r}")
    return host.lower().rstrip("."), int(port) if port else default_port


class AllowList:
    def __init__(self, entries: list[str] | tuple[str, ...] = ()) -> None:
        self.entries: list[Entry] = []
        for e in entries:
            try:
                host, port = split_hostport(e, None)
            except ValueError as exc:
                raise FakError(f"--allow-net {e!r}: {exc}") from None
            if not host or "/" in host or (host.startswith("*") and not host.startswith("*.")):
                raise FakError(f"--allow-net {e!r}: expected HOST, HOST:PORT or *.DOMAIN")
            self.entries.append(Entry(host, port))

    def __bool__(self) -> bool:
        return bool(self.entries)

    def names(self) -> list[str]:
        return [e.host + (f":{e.port}" if e.port else "") for e in self.entries]

    def refusal(self, host: str, port: int) -> str | None:
        """Why `host:port` is refused (None: allowed by name)."""
        host = host.lower().rstrip(".")
        if any(e.matches(host, port) for e in self.entries):
            return None
        return f"{host}:{port} is not in --allow-net ({', '.join(self.names()) or 'none given'})"

    def refusal_of_address(self, host: str, address: str) -> str | None:
        """An allowed name must not lead back into the host: loopback, link-local, unspecified."""
        if _is_ip(host):
            return None  # named by its address on purpose
        ip = ipaddress.ip_address(address.split("%")[0])
        if ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast:
            return f"{host} resolves to {ip}, a loopback or link-local address"
        return None


@dataclass(frozen=True)
class Refusal:
    host: str
    port: int
    reason: str


class NetProxy:
    """The proxy on `path`, served by its own event loop on a thread; `refusals` and `allowed` for the summary."""

    def __init__(self, allow: AllowList, path: str | os.PathLike[str]) -> None:
        self.allow, self.path = allow, Path(path)
        self.refusals: list[Refusal] = []
        self.allowed: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(asyncio.start_unix_server(self._handle, path=str(self.path)))
            except OSError as exc:
                failed.append(exc)
                ready.set()
                return
            os.chmod(self.path, 0o600)
            ready.set()
            loop.run_forever()
            self._server.close()
            loop.run_until_complete(self._server.wait_closed())
            loop.close()

        self._thread = threading.Thread(target=run, name="fak-sandbox-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failed:
            raise FakError(f"the sandbox's proxy cannot listen on {self.path}: {failed[0]}")

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    def refused_by_host(self) -> Counter[str]:
        with self._lock:
            return Counter(f"{r.host}:{r.port}" for r in self.refusals)

    async def _refuse(self, writer: asyncio.StreamWriter, host: str, port: int, reason: str) -> None:
        with self._lock:
            self.refusals.append(Refusal(host, port, reason))
        # info, not warning: the agent owns the terminal; the guard's summary lists every refusal's reason
        log.info("sandbox proxy refused %s:%d: %s", host, port, reason)
        body = f"fak sandbox: refused: {reason}\n".encode()
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nX-Fak-Sandbox: refused\r\n"
                     b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve_one(reader, writer)
        except (TimeoutError, ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        if len(head) > HEAD_LIMIT:
            return
        first, _, rest = head.partition(b"\r\n")
        parts = first.decode("latin-1").split()
        if len(parts) != 3:
            await self._refuse(writer, "?", 0, f"not an HTTP proxy request: {first[:80]!r}")
            return
        method, target, version = parts
        if method == "CONNECT":
            try:
                host, port = split_hostport(target, None)
            except ValueError:
                host, port = target, None
            if port is None:
                await self._refuse(writer, host, 0, f"CONNECT {target!r}: expected HOST:PORT")
                return
            tail = b""
        else:
            scheme, sep, after = target.partition("://")
            if not sep or scheme.lower() != "http":
                await self._refuse(writer, "?", 0, f"{method} {target[:80]!r}: expected CONNECT or an http:// URL")
                return
            authority, slash, path = after.partition("/")
            try:
                host, port = split_hostport(authority.rpartition("@")[2], 80)
            except ValueError:
                host, port = authority, 80
            # origin form for the server, the proxy's own headers dropped, one request per connection
            lines = [ln for ln in rest.split(b"\r\n") if ln and not ln.lower().startswith((b"proxy-", b"connection:"))]
            tail = (f"{method} /{path if slash else ''} {version}\r\n".encode() + b"\r\n".join(lines)
                    + b"\r\nConnection: close\r\n\r\n")
        assert port is not None
        reason = self.allow.refusal(host, port)
        if reason is not None:
            await self._refuse(writer, host, port, reason)
            return
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), CONNECT_TIMEOUT)
        except (TimeoutError, OSError) as exc:
            await self._refuse(writer, host, port, f"{host} does not resolve ({exc})")
            return
        address = infos[0][4][0]
        reason = self.allow.refusal_of_address(host, address)
        if reason is not None:
            await self._refuse(writer, host, port, reason)
            return
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(address, port), CONNECT_TIMEOUT)
        except (TimeoutError, OSError) as exc:
            body = f"fak sandbox: {host}:{port} unreachable: {exc}\n".encode()
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            return
        with self._lock:
            self.allowed[f"{host}:{port}"] += 1
        if method == "CONNECT":
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        else:
            up_w.write(tail)
        try:
            await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))
        finally:
            up_w.close()
