"""A real `fak serve` process on 127.0.0.1 (port picked by the OS) for the server tests; it stops itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import httpx

from support import paths

REPO = paths.REPO


class Server:
    def __init__(self, *args: str, env: dict[str, str] | None = None, boot_timeout: float = 180) -> None:
        # FAK_KV_CACHE_DIR stays (the suite turns KV on disk off: one test's prompts must not be another's hits)
        clean = {k: v for k, v in os.environ.items() if not k.startswith("FAK_") or k == "FAK_KV_CACHE_DIR"} \
            | (env or {})
        self.proc = subprocess.Popen([sys.executable, "-m", "commands.main", "serve", "--port", "0", *args],
                                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=REPO, env=clean)
        self.lines: list[str] = []
        deadline = time.monotonic() + boot_timeout
        assert self.proc.stderr is not None
        while True:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError(f"fak serve exited before listening: {''.join(self.lines)}")
            self.lines.append(line)
            m = re.search(r"listening on (http://[^\s\"]+)", line)  # plain or --json-logs
            if m:
                self.url = m.group(1)
                break
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("fak serve did not listen in time")
        while time.monotonic() < deadline:  # ready once the model is booted
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("fak serve did not become healthy in time")

    def client(self, **kw: object):  # type: ignore[no-untyped-def]
        from openai import OpenAI

        return OpenAI(base_url=self.url + "/v1", api_key=str(kw.pop("api_key", "none")), max_retries=0, **kw)

    def metric(self, name: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
        assert m, f"{name} not in /metrics"
        return float(m.group(1))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)

    def rest_of_stderr(self) -> list[str]:
        """After stop(): what the server wrote to stderr after its listening line."""
        assert self.proc.stderr is not None and self.proc.poll() is not None
        return self.proc.stderr.read().splitlines()
