"""A whole sandbox session under real bwrap: the relay on the sandbox's loopback reaches a gateway that
listens only on a unix socket outside, HTTPS_PROXY inside goes through the allow-list proxy (an allowed
host reached, another refused and counted), the host's loopback is not reachable, the command's exit
status comes back through the relay (init), and a signal sent to init reaches the command."""

from __future__ import annotations

import http.server
import os
import signal
import socketserver
import subprocess
import threading
import time
from pathlib import Path

import pytest

from fak.sandbox import Session, find_bwrap

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")
GATEWAY_PORT = 41999  # inside the sandbox's own network namespace: any port is free there


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"{self.server.greeting} {self.path}\n".encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass

    def address_string(self) -> str:
        return "local"


class UnixHTTP(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class TcpHTTP(http.server.ThreadingHTTPServer):
    daemon_threads = True


def serve(server: socketserver.BaseServer, greeting: str) -> socketserver.BaseServer:
    server.greeting = greeting  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def run_in(box: Session, command: str, cwd: Path, home: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    box.configure(cwd, home, gateway_port=GATEWAY_PORT)
    argv = box.wrap(["bash", "-c", command])
    p = subprocess.Popen(argv, cwd=cwd, env=dict(os.environ, HOME=str(home)), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, pass_fds=[int(argv[argv.index("--info-fd") + 1])])
    box.spawned()
    out, _ = p.communicate(timeout=timeout)
    return subprocess.CompletedProcess(argv, p.returncode, out, "")


def test_gateway_relay_proxy_and_exit_status(tmp_path: Path) -> None:
    host = serve(TcpHTTP(("127.0.0.1", 0), _Hello), "host")
    port = host.server_address[1]
    box = Session([f"127.0.0.1:{port}"], who="test")
    gw = serve(UnixHTTP(str(box.gateway_socket), _Hello), "gateway")
    proj, home = tmp_path / "proj", tmp_path / "home"
    proj.mkdir()
    home.mkdir()
    try:
        r = run_in(box, f"curl -s -m 5 http://127.0.0.1:{GATEWAY_PORT}/v1/messages; "
                        f"curl -s -m 5 --noproxy '' -p http://127.0.0.1:{port}/via-proxy; echo; "
                        "curl -s -m 5 https://example.com/ -o /dev/null -w 'example %{http_code}\\n'; "
                        f"curl -s -m 5 http://127.0.0.1:{port}/direct || echo direct-refused; exit 7", proj, home)
    finally:
        gw.shutdown()
        host.shutdown()
        box.close()
    assert r.returncode == 7, r.stdout  # the command's status, through the relay
    assert "gateway /v1/messages" in r.stdout  # 127.0.0.1:PORT inside = the unix socket outside
    assert "host /via-proxy" in r.stdout  # an allowed host, through HTTPS_PROXY's CONNECT
    assert "example 000" in r.stdout or "example 403" in r.stdout  # refused by the proxy
    assert "direct-refused" in r.stdout  # the host's loopback is not the sandbox's
    rep = box.report()
    assert rep["net_refused_hosts"] == {"example.com:443": 1} and rep["net_allowed"] == {f"127.0.0.1:{port}": 1}
    assert "not in --allow-net" in rep["net_refused_reasons"]["example.com:443"]
    assert not box.dir.exists()  # the sockets are gone with the session


def test_a_signal_to_init_reaches_the_command(tmp_path: Path) -> None:
    box = Session(who="test")
    proj = tmp_path / "proj"
    proj.mkdir()
    try:
        box.configure(proj, tmp_path, gateway_port=GATEWAY_PORT)
        argv = box.wrap(["bash", "-c", "trap 'echo got-term > term.txt; exit 3' TERM; touch ready; "
                                       "while true; do sleep 0.1; done"])
        p = subprocess.Popen(argv, cwd=proj, pass_fds=[int(argv[argv.index("--info-fd") + 1])])
        box.spawned()
        assert box.init_pid is not None and box.init_pid != p.pid
        deadline = time.time() + 30
        while not (proj / "ready").exists() and time.time() < deadline:
            time.sleep(0.05)
        os.kill(box.init_pid, signal.SIGTERM)  # what fak guard does with a `kill -TERM <guard>`
        rc = p.wait(timeout=30)
    finally:
        box.close()
    assert (proj / "term.txt").read_text() == "got-term\n" and rc == 3
