"""Ray across hosts: a real multi-node Ray cluster (`ray start --head` on host 1, `ray start --address` on
hosts 2 and 3, each its own network namespace; tests/support/raycluster.py) with Ray's token authentication
on, and `fak serve --ray HOST:PORT` on the head's host placing its workers on the other two.

`--stages 2` and `--pd 1:2` give the colocated server's greedy outputs for 16 concurrent requests, with every
worker on hosts 2 and 3 (the head has no CPUs to place on); a driver without Ray's token is refused.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from support.netns import Hosts, make_hosts
from support.paths import REPO
from support.raycluster import RayCluster
from support.serve_helpers import Server

pytest.importorskip("ray")
pytestmark = [pytest.mark.serve, pytest.mark.gemma, pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(900)]
MODEL = "gemma3-270m"
NEW = 12
PROMPTS = [f"{w} number {i} is" for i, w in enumerate(["The story", "def f(x):", "A list:", "Dear Sam,"] * 4)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Hosts, RayCluster]]:
    with make_hosts(3) as hosts:
        yield hosts, RayCluster(hosts, [2, 3], tmp_path_factory.mktemp("ray"))


def _complete(url: str, prompt: str, out: dict[str, str]) -> None:
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": NEW,
                                                  "temperature": 0}, timeout=300)
    assert r.status_code == 200, r.text
    out[prompt] = r.json()["choices"][0]["text"]


def _all(url: str) -> dict[str, str]:
    out: dict[str, str] = {}
    ts = [threading.Thread(target=_complete, args=(url, p, out)) for p in PROMPTS]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    return out


@pytest.fixture(scope="module")
def colocated() -> dict[str, str]:
    s = Server("--gguf", MODEL)
    try:
        return _all(s.url)
    finally:
        s.stop()


class _Serve:
    """`fak serve` as the Ray driver, in the head's namespace, listening on its bridge address."""

    def __init__(self, hosts: Hosts, ray: RayCluster, *args: str, env: dict[str, str] | None = None) -> None:
        clean = {k: v for k, v in ray.env.items() if not k.startswith("FAK_") or k == "FAK_KV_CACHE_DIR"}
        self.proc = hosts.popen(1, [sys.executable, "-m", "commands.main", "serve", "--host", hosts.addr(1),
                                    "--port", "0", "--gguf", MODEL, "--ray", ray.address, *args],
                                cwd=REPO, env={**clean, **(env or {})}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.lines.append(line)
            m = re.search(r"listening on (http://[^\s\"]+)", line)
            if m:
                self.url = m.group(1)
                threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True).start()  # type: ignore[arg-type]
                break
        else:
            raise AssertionError("fak serve --ray did not listen in time")
        if not hasattr(self, "url"):
            raise AssertionError("fak serve --ray exited: " + "".join(self.lines[-20:]))
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise AssertionError("fak serve --ray not healthy in time: " + "".join(self.lines[-20:]))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def _actor_hosts(hosts: Hosts) -> list[int]:
    """The hosts with a fak worker actor process (`ray::_Host...` in its command line)."""
    found = []
    for i in (1, 2, 3):
        pids = subprocess.run(["ip", "netns", "pids", hosts.ns(i)], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "_Host" in cmd:
                found.append(i)
    return sorted(found)


@pytest.mark.parametrize("topology", [["--stages", "2"], ["--pd", "1:2"]], ids=["stages", "pd"])
def test_fak_serve_over_a_ray_cluster_across_hosts_equals_colocated(cluster: tuple[Hosts, RayCluster],
                                                                    colocated: dict[str, str],
                                                                    topology: list[str]) -> None:
    hosts, ray = cluster
    s = _Serve(hosts, ray, *topology)
    try:
        got = _all(s.url)
        assert got == colocated
        placed = _actor_hosts(hosts)
        assert 1 not in placed and set(placed) == {2, 3}, placed  # every worker on the other hosts, both used
        if topology[0] == "--pd":
            line = next(ln for ln in s.lines if "P/D over tcp" in ln)
            assert hosts.addr(2) in line and hosts.addr(3) in line and hosts.addr(1) + ":" not in line
    finally:
        s.stop()
    deadline = time.monotonic() + 60  # the driver's exit takes its actors with it
    while _actor_hosts(hosts) and time.monotonic() < deadline:
        time.sleep(0.5)


def test_a_driver_without_rays_token_is_refused(cluster: tuple[Hosts, RayCluster], tmp_path: Path) -> None:
    """Refused by the GCS at once ("InvalidAuthToken"); Ray's client then retries for ~20 s before giving up,
    so the test reads the refusal and stops the driver there."""
    hosts, ray = cluster
    env = {k: v for k, v in ray.env.items() if not k.startswith("RAY_AUTH")} | {"RAY_AUTH_MODE": "token",
                                                                                "RAY_AUTH_TOKEN": "not-the-token"}
    log = tmp_path / "driver.log"
    code = f"import ray; ray.init(address={ray.address!r}); print('joined', flush=True)"
    with log.open("w") as out:
        p = hosts.popen(1, [sys.executable, "-c", code], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and p.poll() is None and "InvalidAuthToken" not in log.read_text():
            time.sleep(0.2)
        text = log.read_text()
        assert "InvalidAuthToken" in text and "joined" not in text, text[-1500:]
    finally:
        p.kill()
        p.wait(10)
