"""Test "hosts" as Linux network namespaces, for multi-machine tests on one machine.

N host namespaces hang off one bridge that lives in a "switch" namespace of its own; the test process
(the root namespace) can join the bridge as host 0. Addresses are a /24 of 198.18.0.0/15 (the benchmarking
range, never routed anywhere real); no namespace has a default route, so nothing a host runs can leave the
bridge. Every name carries the pid (`fak<pid>h<i>`, `fak<pid>sw`, `fak<pid>r`): two concurrent runs do not
collide, and a run finds the sets left by killed runs (their pid is dead) and removes them.

    with make_hosts(3) as hosts:
        server = hosts.popen(2, [sys.executable, "server.py", hosts.addr(2)])
        hosts.run(1, [sys.executable, "client.py", hosts.addr(2)], timeout=10)
        hosts.link_down(2)      # cut host 2's cable at the switch
        hosts.kill(2)           # SIGKILL everything running in host 2

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN: `ip netns add` mounts under /run/netns) and iproute2 (`ip`, `bridge`).
`make_hosts` skips the test, with one line naming what failed, on a machine that cannot make them.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Sequence
from typing import Any, Literal

BRIDGE = "br0"
HOST_IF = "eth0"  # the host's side of its cable, inside its own namespace: the name is free there
NET16 = "198.18"  # the /24 is NET16.X, X from the pid
# a killed run's leftovers: namespaces fak<pid>h<i> / fak<pid>sw, and root-namespace links fak<pid>r...
_NS_NAME = re.compile(r"^fak(\d+)(?:h\d+|sw)$")
_ROOT_LINK = re.compile(r"^\d+:\s+(fak(\d+)r[^@:\s]*)[@:]", re.MULTILINE)

# how link_down cuts host i off: "switch" disables its bridge port (the host's interface stays up with carrier:
# a cut beyond the host's NIC, seen only as silence); "peer" takes the switch-side veth down (the host sees
# NO-CARRIER, as when its own cable is pulled); "host" takes the host's interface itself down (its /24 route
# goes with it: connects fail at once with ENETUNREACH instead of timing out)
Side = Literal["switch", "peer", "host"]

_active: Hosts | None = None  # names carry only the pid, so one set per process at a time


class NetnsError(RuntimeError):
    """An `ip` step of building or tearing down the hosts failed."""


class NetnsUnavailable(NetnsError):
    """This machine cannot make namespaces, bridges or veths at all: a reason to skip, not a bug."""


def _run(argv: list[str], check: bool = True, unavailable: bool = False) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    if check and r.returncode != 0:
        why = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[0]
        raise (NetnsUnavailable if unavailable else NetnsError)(f"`{' '.join(argv)}` failed: {why}")
    return r


def _ip(*args: str, check: bool = True, unavailable: bool = False) -> subprocess.CompletedProcess[str]:
    return _run(["ip", *args], check=check, unavailable=unavailable)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def _netns_names() -> list[str]:
    # lines are "name" or "name (id: N)"
    return [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()]


def _root_links() -> list[tuple[str, int]]:
    return [(m[1], int(m[2])) for m in _ROOT_LINK.finditer(_ip("-o", "link", "show", check=False).stdout)]


def _kill_netns_pids(ns: str) -> None:
    """SIGKILL whatever runs in `ns`: a deleted namespace's name goes at once, but the namespace itself (and
    its veths) lives on while a process is in it, and so would a server a killed run left behind."""
    for tok in _ip("netns", "pids", ns, check=False).stdout.split():
        try:
            os.kill(int(tok), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _delete_netns(ns: str) -> None:
    _kill_netns_pids(ns)
    _ip("netns", "del", ns, check=False)


def names_of(pid: int) -> list[str]:
    """The namespaces and root-namespace links that belong to run `pid` (what teardown must leave none of)."""
    ns = [n for n in _netns_names() if (m := _NS_NAME.match(n)) and int(m[1]) == pid]
    return ns + [name for name, p in _root_links() if p == pid]


def remove_stale(own_too: bool = False) -> list[str]:
    """Delete the namespaces and root links of runs whose process is gone (and this process's own, with
    `own_too`: a set an earlier Hosts here failed to tear down). Returns the names removed."""
    me = os.getpid()

    def stale(pid: int) -> bool:
        return (own_too and pid == me) or (pid != me and not _alive(pid))

    removed = []
    for ns in _netns_names():
        if (m := _NS_NAME.match(ns)) and stale(int(m[1])):
            _delete_netns(ns)
            removed.append(ns)
    for name, pid in _root_links():
        if stale(pid):
            _ip("link", "del", name, check=False)  # gone already when its peer's namespace went
            removed.append(name)
    return removed


def _pick_subnet(pid: int) -> str:
    """NET16.X with X = pid % 250, or the next X no other run has routed in the root namespace (two pids
    250 apart would otherwise put two /24 routes for the same prefix on two different bridges)."""
    used = {int(x) for x in re.findall(rf"^{re.escape(NET16)}\.(\d+)\.0/24", _ip("-4", "route", "show").stdout, re.M)}
    for k in range(250):
        x = (pid + k) % 250
        if x not in used:
            return f"{NET16}.{x}"
    raise NetnsError(f"every {NET16}.X.0/24 with X < 250 is routed in the root namespace")


class Hosts:
    """N namespaces on one bridge (plus the root namespace as host 0 when `root`). A context manager; the
    teardown runs on exit, at interpreter exit, and is idempotent."""

    def __init__(self, n: int, root: bool = True) -> None:
        global _active
        if n < 1:
            raise ValueError(f"need at least one host, got {n}")
        if _active is not None:
            raise NetnsError(f"a Hosts is already up in this process ({_active.switch}); names carry only the pid")
        self.n, self.root = n, root
        self.pid = os.getpid()
        self.switch = f"fak{self.pid}sw"
        self.root_link = f"fak{self.pid}r"
        self._procs: dict[int, list[subprocess.Popen[Any]]] = {i: [] for i in range(n + 1)}
        self._closed = False
        self.removed_stale = remove_stale(own_too=True)
        self.net = _pick_subnet(self.pid)
        _active = self
        atexit.register(self.close)  # a partial build is torn down too
        try:
            self._build()
        except BaseException:
            try:
                self.close()
            except NetnsError:
                pass  # the build's own error is the one to see
            raise

    # --- building --------------------------------------------------------------------------------------------

    def _build(self) -> None:
        # the first namespace, bridge and veth are the probes: failing there means the machine cannot do it
        _ip("netns", "add", self.switch, unavailable=True)
        _ip("-n", self.switch, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", BRIDGE, "type", "bridge", unavailable=True)  # STP off: ports forward at once
        _ip("-n", self.switch, "link", "set", BRIDGE, "up")
        for i in range(1, self.n + 1):
            ns = self.ns(i)
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", self.switch, "link", "add", self._port(i), "type", "veth", "peer", "name", HOST_IF, "netns", ns,
                unavailable=i == 1)
            self._attach(self._port(i))
            _ip("-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", HOST_IF)
            _ip("-n", ns, "link", "set", HOST_IF, "up")
        if self.root:
            # the address brings its connected /24 route and nothing else: no forwarding, the default route untouched
            _ip("link", "add", self.root_link, "type", "veth", "peer", "name", self._port(0), "netns", self.switch)
            self._attach(self._port(0))
            _ip("addr", "add", f"{self.addr(0)}/24", "dev", self.root_link)
            _ip("link", "set", self.root_link, "up")

    def _attach(self, port: str) -> None:
        _ip("-n", self.switch, "link", "set", port, "master", BRIDGE)
        _ip("-n", self.switch, "link", "set", port, "up")

    @staticmethod
    def _port(i: int) -> str:
        return f"p{i}"  # host i's cable end on the switch (p0: the root namespace's)

    # --- addressing ------------------------------------------------------------------------------------------

    def _check(self, i: int, zero: bool) -> None:
        if not (0 if zero else 1) <= i <= self.n:
            raise ValueError(f"host {i}: hosts are 1..{self.n}" + (" (0: the root namespace)" if zero else ""))
        if i == 0 and not self.root:
            raise ValueError("host 0 is the root namespace, and these hosts were made with root=False")

    def addr(self, i: int) -> str:
        """Host i's address (1-based); 0 is the root namespace's end (.254)."""
        self._check(i, zero=True)
        return f"{self.net}.{254 if i == 0 else i}"

    def ns(self, i: int) -> str:
        """Host i's namespace name (1-based; the root namespace has none)."""
        self._check(i, zero=False)
        return f"fak{self.pid}h{i}"

    # --- processes -------------------------------------------------------------------------------------------

    def _argv(self, i: int, argv: Sequence[str]) -> list[str]:
        if i == 0:
            return list(argv)  # host 0 is the test process's own namespace; any process may run there
        return ["ip", "netns", "exec", self.ns(i), *argv]

    def popen(self, i: int, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Start argv in host i (0: the root namespace) in a session of its own, tracked for kill and teardown.
        `ip netns exec` execs argv in place, so the Popen's pid is argv's process."""
        if self._closed:
            raise NetnsError(f"{self.switch}: these hosts are torn down")
        if i != 0:
            self._check(i, zero=False)
        if popen_kwargs.pop("start_new_session", True) is not True:
            raise ValueError("popen runs every process in a session of its own (teardown kills the group)")
        p = subprocess.Popen(self._argv(i, argv), start_new_session=True, **popen_kwargs)
        self._procs[i].append(p)
        return p

    def run(self, i: int, argv: Sequence[str], timeout: float = 30.0, **popen_kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run argv in host i to completion; stdout and stderr as text. A timeout kills its process group and
        raises subprocess.TimeoutExpired. A nonzero exit is the caller's to judge (no check)."""
        popen_kwargs.setdefault("stdout", subprocess.PIPE)
        popen_kwargs.setdefault("stderr", subprocess.PIPE)
        popen_kwargs.setdefault("text", True)
        p = self.popen(i, argv, **popen_kwargs)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _killpg(p)
            p.communicate()
            raise
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    def kill(self, i: int) -> None:
        """SIGKILL every process started in host i (their whole groups), and, for a namespace host, anything
        else still running in it: the host crashes. Reaps what it started."""
        for p in self._procs[i]:
            _killpg(p)
        if i != 0:
            _kill_netns_pids(self.ns(i))
        for p in self._procs[i]:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:  # in uninterruptible sleep: teardown's netns del still goes ahead
                pass

    # --- the cable -------------------------------------------------------------------------------------------

    def link_down(self, i: int, side: Side = "switch") -> None:
        """Cut host i off the bridge (0: the root namespace's link). See Side for what each side looks like."""
        self._set_link(i, side, up=False)

    def link_up(self, i: int, side: Side = "switch") -> None:
        """Undo link_down(i, side) (the same side)."""
        self._set_link(i, side, up=True)

    def _set_link(self, i: int, side: Side, up: bool) -> None:
        self._check(i, zero=True)
        if side == "switch":
            # a disabled port drops every frame both ways; with STP off nothing sets it back. Through `bridge`: iproute2
            # 6.1's `ip link set ... type bridge_slave state 0` exits 0 and leaves the port forwarding
            want = "forwarding" if up else "disabled"
            _run(["bridge", "-n", self.switch, "link", "set", "dev", self._port(i), "state", "3" if up else "0"])
            shown = _run(["bridge", "-n", self.switch, "link", "show", "dev", self._port(i)]).stdout
            if f"state {want}" not in shown:
                raise NetnsError(f"{self._port(i)} in {self.switch} should be {want}: {shown.strip()}")
        elif side == "peer":
            _ip("-n", self.switch, "link", "set", "dev", self._port(i), "up" if up else "down")
        elif side == "host":
            where = [] if i == 0 else ["-n", self.ns(i)]
            _ip(*where, "link", "set", "dev", self.root_link if i == 0 else HOST_IF, "up" if up else "down")
        else:
            raise ValueError(f"side is switch, peer or host, not {side!r}")

    # --- teardown --------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill what was started, delete the namespaces (their veths go with them) and the root link. Safe to
        call twice; raises NetnsError if something of this pid is still there afterwards."""
        global _active
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            for i in self._procs:
                self.kill(i)
                for p in self._procs[i]:
                    for f in (p.stdin, p.stdout, p.stderr):
                        if f is not None:
                            f.close()
            for i in range(1, self.n + 1):
                _delete_netns(self.ns(i))
            _delete_netns(self.switch)
            if self.root:
                _ip("link", "del", self.root_link, check=False)  # often gone already with its peer's namespace
        finally:
            if _active is self:
                _active = None
        left = names_of(self.pid)
        if left:
            raise NetnsError(f"teardown of {self.switch} left {left}")

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _killpg(p: subprocess.Popen[Any]) -> None:
    # only while the leader is unreaped: its pid (and so its group id) cannot have been reused yet
    if p.returncode is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def make_hosts(n: int, root: bool = True) -> Hosts:
    """Hosts(n, root) for a test, or pytest.skip with one line naming what this machine lacks."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip(f"netns hosts: not root (euid {os.geteuid()}); `ip netns add` needs CAP_SYS_ADMIN and CAP_NET_ADMIN")
    missing = [tool for tool in ("ip", "bridge") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"netns hosts: no {' or '.join(f'`{t}`' for t in missing)} (iproute2) on PATH")
    try:
        return Hosts(n, root=root)
    except NetnsUnavailable as exc:
        pytest.skip(f"netns hosts: {exc}")
