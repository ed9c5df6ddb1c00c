"""The netns test hosts (tests/support/netns.py): hosts reach each other and the root namespace over the bridge
and nothing else; a cut cable stops traffic and mending it restores it; teardown leaves nothing of the run
even when the body raised; a killed run's leftovers are removed by the next one."""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from support.loopback import LoopbackServer
from support.netns import Hosts, make_hosts

pytestmark = pytest.mark.timeout(60)

PORT = 7000  # each host has its own port space: no clash with anything in the root namespace
ECHO = """
import socket, sys
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    c, _ = s.accept()
    with c:
        c.sendall(c.recv(1024))
"""
# prints what the echo server sent back, or "ERR <exception>" and exits 1
CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as s:
        s.sendall(b"hello")
        print(s.recv(1024).decode())
except OSError as e:
    print(f"ERR {type(e).__name__}: {e}")
    sys.exit(1)
"""


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    with make_hosts(3) as h:
        yield h


def start_echo(hosts: Hosts, i: int) -> subprocess.Popen[str]:
    p = hosts.popen(i, [sys.executable, "-c", ECHO, hosts.addr(i), str(PORT)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    with selectors.DefaultSelector() as sel:  # readline alone would hang the test on a server that never starts
        sel.register(p.stdout, selectors.EVENT_READ)
        assert sel.select(timeout=10), "echo server did not start"
    assert p.stdout.readline().strip() == "ready"
    return p


def connect(hosts: Hosts, frm: int, to: str, port: int = PORT, timeout: float = 1.0) -> str:
    r = hosts.run(frm, [sys.executable, "-c", CLIENT, to, str(port), str(timeout)], timeout=timeout + 10)
    return r.stdout.strip()


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def gone(pid: int, within: float = 5.0) -> bool:
    """pid has exited: no such process, or a zombie (reparented to an init that may never reap it)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False


def test_hosts_reach_each_other_and_the_root_namespace(hosts: Hosts) -> None:
    start_echo(hosts, 2)
    assert connect(hosts, 1, hosts.addr(2), timeout=5) == "hello"
    with socket.create_connection((hosts.addr(2), PORT), timeout=5) as s:  # host 0: the test process itself
        s.sendall(b"from root")
        assert s.recv(1024) == b"from root"
    assert hosts.addr(1).rsplit(".", 1)[1] == "1" and hosts.addr(0).rsplit(".", 1)[1] == "254"


def test_nothing_outside_the_bridge_is_reachable(hosts: Hosts) -> None:
    default_before = ip("-4", "route", "show", "default")
    root_loopback = LoopbackServer()  # listening on the root namespace's 127.0.0.1
    try:
        out = connect(hosts, 1, "127.0.0.1", port=root_loopback.port)
        assert out.startswith("ERR ConnectionRefusedError"), out  # host 1's own loopback: nobody listens there
        assert root_loopback.hits == 0
    finally:
        root_loopback.close()
    out = connect(hosts, 1, "198.51.100.1", port=80)  # TEST-NET-2: anywhere off the bridge
    assert out.startswith("ERR") and "unreachable" in out, out
    for ns in [hosts.ns(i) for i in (1, 2, 3)] + [hosts.switch]:
        assert "default" not in ip("-n", ns, "route"), ns
    assert ip("-4", "route", "show", "default") == default_before  # the root namespace's way out is untouched


@pytest.mark.slow
def test_a_cut_cable_stops_traffic_and_mending_it_restores_it(hosts: Hosts) -> None:
    start_echo(hosts, 2)
    assert connect(hosts, 1, hosts.addr(2), timeout=5) == "hello"
    hosts.link_down(2)  # at the switch: host 2 does not see its own interface change
    assert "LOWER_UP" in ip("-n", hosts.ns(2), "link", "show", "eth0")
    assert connect(hosts, 1, hosts.addr(2)).startswith("ERR TimeoutError")
    hosts.link_up(2)
    assert connect(hosts, 1, hosts.addr(2), timeout=5) == "hello"

    hosts.link_down(2, side="peer")  # the switch's end of the veth: host 2 loses carrier, as with a pulled cable
    assert "NO-CARRIER" in ip("-n", hosts.ns(2), "link", "show", "eth0")
    assert connect(hosts, 1, hosts.addr(2)).startswith("ERR TimeoutError")
    hosts.link_up(2, side="peer")
    assert connect(hosts, 1, hosts.addr(2), timeout=5) == "hello"

    hosts.link_down(2, side="host")  # host 2's own interface: its /24 route goes with it
    assert connect(hosts, 2, hosts.addr(1)).startswith("ERR OSError: [Errno 101]")  # ENETUNREACH, at once
    hosts.link_up(2, side="host")
    assert connect(hosts, 1, hosts.addr(2), timeout=5) == "hello"


def test_kill_ends_every_process_in_the_host(hosts: Hosts) -> None:
    server = start_echo(hosts, 2)
    hosts.kill(2)
    assert server.returncode == -9
    assert connect(hosts, 1, hosts.addr(2)).startswith("ERR ConnectionRefusedError")  # the host is up, its server gone
    assert ip("netns", "pids", hosts.ns(2)).split() == []


def test_teardown_leaves_nothing_even_when_the_body_raised() -> None:
    pid = str(os.getpid())
    # a daemon that left its parent's session: only the sweep of the namespace's pids finds it
    daemon = ("import subprocess, sys, time\n"
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
              "print(p.pid, flush=True)\ntime.sleep(60)\n")
    with pytest.raises(RuntimeError, match="the body failed"):
        with make_hosts(2) as h:
            p = h.popen(1, [sys.executable, "-c", daemon], stdout=subprocess.PIPE, text=True)
            assert p.stdout is not None
            grandchild = int(p.stdout.readline())
            raise RuntimeError("the body failed")
    assert p.returncode == -9
    assert gone(grandchild)
    assert [n for n in ip("netns", "list").split() if n.startswith(f"fak{pid}")] == []
    assert f"fak{pid}" not in ip("-o", "link", "show")
    h.close()  # idempotent


def test_a_dead_runs_leftovers_are_removed() -> None:
    stale, stale_link = "fak999999h1", "fak999999r"  # the leftovers of run 999999, which is not alive here
    try:
        os.kill(999999, 0)
        pytest.skip("pid 999999 is alive on this machine: its names would not be stale")
    except ProcessLookupError:
        pass
    subprocess.run(["ip", "netns", "del", stale], capture_output=True)
    if subprocess.run(["ip", "netns", "add", stale], capture_output=True).returncode != 0:
        make_hosts(1, root=False)  # skips with the reason (or fails on what else went wrong)
    try:
        subprocess.run(["ip", "link", "add", stale_link, "type", "veth", "peer", "name", "fak999999rp"], check=True)
        assert stale in ip("netns", "list").split() and stale_link in ip("-o", "link", "show")
        with make_hosts(1, root=False) as h:
            assert stale in h.removed_stale and stale_link in h.removed_stale
            assert stale not in ip("netns", "list").split()
            assert "fak999999" not in ip("-o", "link", "show")
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)
        subprocess.run(["ip", "link", "del", stale_link], capture_output=True)
