"""The allow-list proxy: which names and ports pass, and the proxy itself on a unix socket: CONNECT and
plain HTTP to an allowed listener go through, anything else is a 403 whose body and record name why,
and an allowed name that resolves to loopback does not lead back into the host."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fak.errors import FakError
from fak.sandbox.proxy import AllowList, NetProxy
from support.loopback import LoopbackServer, echo_first_line


def test_allow_list_matches_names_ports_and_subdomains() -> None:
    al = AllowList(["pypi.org", "files.pythonhosted.org:443", "*.github.com", "10.0.0.5:8080"])
    assert al.refusal("pypi.org", 443) is None and al.refusal("PyPI.org.", 80) is None
    assert al.refusal("files.pythonhosted.org", 443) is None
    assert "not in --allow-net" in (al.refusal("files.pythonhosted.org", 80) or "")
    assert al.refusal("api.github.com", 443) is None
    assert al.refusal("github.com", 443) is not None  # *.DOMAIN: subdomains only
    assert al.refusal("evilgithub.com", 443) is not None
    assert al.refusal("10.0.0.5", 8080) is None and al.refusal("10.0.0.5", 22) is not None
    none = AllowList()
    assert not none and "(none given)" in (none.refusal("example.com", 443) or "")


def test_an_allowed_name_may_not_resolve_into_the_host() -> None:
    al = AllowList(["internal.example", "127.0.0.1"])
    assert "loopback or link-local" in (al.refusal_of_address("internal.example", "127.0.0.1") or "")
    assert "loopback or link-local" in (al.refusal_of_address("internal.example", "169.254.169.254") or "")
    assert al.refusal_of_address("internal.example", "93.184.216.34") is None
    assert al.refusal_of_address("127.0.0.1", "127.0.0.1") is None  # named by its address: meant


@pytest.mark.parametrize("entry", ["", "a/b", "host:0", "host:99999", "*foo.com"])
def test_bad_entries_are_one_line(entry: str) -> None:
    with pytest.raises(FakError, match="--allow-net"):
        AllowList([entry])


def ask(path: Path, request: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(path))
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
            if request.startswith(b"CONNECT") and b"\r\n\r\n" in out and out.startswith(b"HTTP/1.1 200"):
                s.sendall(b"GET /tunnel HTTP/1.0\r\n\r\n")  # through the tunnel, to the server itself
                request = b""
        return out


def test_the_proxy_passes_allowed_and_refuses_the_rest(tmp_path: Path) -> None:
    echo = LoopbackServer(echo_first_line, read=True)
    proxy = NetProxy(AllowList([f"127.0.0.1:{echo.port}", "localhost"]), tmp_path / "proxy.sock")
    proxy.start()
    try:
        out = ask(proxy.path, f"CONNECT 127.0.0.1:{echo.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert out.startswith(b"HTTP/1.1 200 Connection Established") and b"got GET /tunnel HTTP/1.0" in out
        out = ask(proxy.path, f"GET http://127.0.0.1:{echo.port}/p?q=1 HTTP/1.1\r\nHost: x\r\n"
                              f"Proxy-Connection: keep-alive\r\n\r\n".encode())
        assert b"got GET /p?q=1 HTTP/1.1" in out  # origin form for the server
        out = ask(proxy.path, b"CONNECT example.com:443 HTTP/1.1\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 403") and b"example.com:443 is not in --allow-net" in out
        out = ask(proxy.path, f"CONNECT localhost:{echo.port} HTTP/1.1\r\n\r\n".encode())
        assert out.startswith(b"HTTP/1.1 403") and b"loopback" in out  # a name is not a way back in
        out = ask(proxy.path, b"GET https://example.com/ HTTP/1.1\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 403")
    finally:
        proxy.stop()
    assert sum(proxy.refused_by_host().values()) == 3
    assert proxy.allowed == {f"127.0.0.1:{echo.port}": 2}
    assert [r.host for r in proxy.refusals] == ["example.com", "localhost", "?"]
