"""A real multi-node Ray cluster for tests: `ray start --head` on one netns host and `ray start --address`
on others (tests/support/netns.py), with Ray's token authentication on.

What one machine needs so the nodes do not share state (Ray 2.60, found by trying): a `--temp-dir` per node
(else every node's sockets and logs land in the head's), `--node-ip-address` always (no default route:
Ray would guess 127.0.0.1), and never `ray stop` (it finds raylets with `ps`, which every namespace
shares: it would stop every cluster on the machine). A node is stopped by killing the processes of its
namespace (Hosts.close does). A driver must run on a node's namespace (it attaches to a raylet it finds
with `ps`): `fak serve --ray` runs in the head's.

Token auth (`RAY_AUTH_MODE=token`, the token in a file named by `RAY_AUTH_TOKEN_PATH`, never the shared
`~/.ray/auth_token`): every node, driver and CLI call needs both; one without is refused by the GCS.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

from support.netns import Hosts

PORT = 6379


def ray_bin() -> str:
    near = Path(sys.executable).parent / "ray"
    return str(near) if near.exists() else (shutil.which("ray") or "ray")


class RayCluster:
    """Node 1 the head (no CPUs: nothing is placed on it), nodes 2.. workers with `cpus` each and a
    resource `host<i>` naming them."""

    def __init__(self, hosts: Hosts, workers: list[int], root: Path, cpus: int = 2) -> None:
        self.hosts = hosts
        self.token_file = root / "ray_token"
        self.token_file.write_text(secrets.token_hex(32))
        self.token_file.chmod(0o600)
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_file),
                    # a dead node noticed in ~3 s, not ~13
                    "RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
                    "RAY_health_check_failure_threshold": "3", "RAY_USAGE_STATS_ENABLED": "0"}
        self.address = f"{hosts.addr(1)}:{PORT}"
        self._start(1, root, ["--head", "--port", str(PORT), "--num-cpus", "0", "--include-dashboard=false"])
        for i in workers:
            self._start(i, root, ["--address", self.address, "--num-cpus", str(cpus)])

    def _start(self, i: int, root: Path, args: list[str]) -> None:
        log = root / f"ray_start_{i}.log"
        with log.open("w") as out:  # a file, not a pipe: the daemons it starts would hold a pipe open
            r = self.hosts.run(i, [ray_bin(), "start", *args, "--node-ip-address", self.hosts.addr(i),
                                   "--temp-dir", str(root / f"ray{i}"), "--object-store-memory", "80000000",
                                   "--disable-usage-stats",
                                   "--resources", json.dumps({f"host{i}": 1})],
                               timeout=120, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            raise RuntimeError(f"ray start on host {i} failed: {log.read_text()[-2000:]}")
