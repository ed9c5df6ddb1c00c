"""`fak serve` with its engine spread over processes, on Gemma 3 270M.

`--pd 1:2`: a head process and three `fak worker` processes (one prefill, two decode, shm transport).
Greedy completions equal the colocated server's; SIGKILL of a decode worker process mid-stream: every
stream still completes with the tokens a healthy run gives; the P/D figures reach /fak/stats and /metrics.
`--stages 2`: two `fak worker --role stage` processes (layers 0:17, 17:18 + the LM head): the same completions; the
pipeline figures reach /fak/stats and /metrics. Bad P/D and pipeline flags are one line and exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from support.serve_helpers import REPO, Server

pytestmark = [pytest.mark.serve, pytest.mark.gemma, pytest.mark.timeout(600), pytest.mark.slow]

PROMPTS = ["The history of the printing press", "def fibonacci(n):", "A recipe for bread:\n1.",
           "The three laws of motion are", "Dear diary, today I", "SELECT name FROM users WHERE"]
NEW = 48


def _complete(url: str, prompt: str, out: dict[str, object], key: str, started: threading.Event | None = None) -> None:
    body = {"model": "gemma3-270m", "prompt": prompt, "max_tokens": NEW, "temperature": 0, "stream": True}
    text, chunks = "", 0
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            c = json.loads(line[6:])["choices"][0]
            text += c["text"]
            chunks += 1
            if chunks == 4 and started is not None:
                started.set()
            if c.get("finish_reason"):
                out[key] = (text, c["finish_reason"])


def _run_all(url: str, on_started: object = None) -> dict[str, object]:
    out: dict[str, object] = {}
    started = threading.Event()
    ts = [threading.Thread(target=_complete, args=(url, p, out, p, started)) for p in PROMPTS]
    for t in ts:
        t.start()
    if on_started is not None:
        assert started.wait(120)
        on_started()  # type: ignore[operator]
    for t in ts:
        t.join(180)
    return out


def _beats(pd: dict[str, object]) -> tuple[int, int]:
    """(requests the prefill worker reports, imports the decode workers report): their last heartbeats."""
    dec = [v for v in pd.values() if isinstance(v, dict) and v.get("role") == "decode"]
    return int(pd["prefill"].get("requests", 0)), sum(int(v.get("imports", 0)) for v in dec)  # type: ignore[union-attr]


def _stats(url: str) -> dict[str, object]:
    return dict(httpx.get(url + "/fak/stats", timeout=10).json())


@pytest.fixture(scope="module")
def colocated() -> dict[str, object]:
    s = Server("--gguf", "gemma3-270m")
    try:
        return _run_all(s.url)
    finally:
        s.stop()


def test_pd_serve_equals_colocated_and_survives_a_decode_worker_kill(colocated: dict[str, object]) -> None:
    s = Server("--gguf", "gemma3-270m", "--pd", "1:2", boot_timeout=300)
    try:
        healthy = _run_all(s.url)
        assert healthy == colocated and len(healthy) == len(PROMPTS)
        deadline = time.monotonic() + 10  # the workers' own figures come with their next heartbeat
        while time.monotonic() < deadline and _beats(_stats(s.url)["pd"]) < (len(PROMPTS), len(PROMPTS)):
            time.sleep(0.1)
        pd = _stats(s.url)["pd"]
        decoders = {k: v for k, v in pd.items() if isinstance(v, dict) and v.get("role") == "decode"}
        assert len(decoders) == 2 and all(v["up"] and v["prefill_tokens"] == 0 for v in decoders.values())
        assert sum(v["requests"] for v in decoders.values()) == len(PROMPTS) == pd["prefill"]["requests"]
        assert sum(v["imports"] for v in decoders.values()) == len(PROMPTS)
        assert "fak_pd_bytes_moved_total" in httpx.get(s.url + "/metrics").text
        rows = httpx.get(s.url + "/v1/fak/stats", timeout=10).json()["workers"]  # the web console's P/D rows
        assert sorted((w["name"], w["role"], w["up"]) for w in rows) == sorted(
            [("prefill", "prefill", True)] + [(k, "decode", True) for k in decoders])

        killed: list[str] = []

        def kill_busiest() -> None:
            now = _stats(s.url)["pd"]
            name = max((k for k in decoders), key=lambda k: now[k]["load"])
            killed.append(name)
            os.kill(int(now[name]["pid"]), signal.SIGKILL)

        after = _run_all(s.url, kill_busiest)
        assert after == healthy  # every stream completed, same greedy text, nothing lost or repeated
        pd = _stats(s.url)["pd"]
        assert pd[killed[0]]["up"] is False and pd["head"]["down"] == 1 and pd["head"]["failed_over"] >= 1
        again = _run_all(s.url)  # the survivor serves everything now
        assert again == healthy
        pids = [int(v["pid"]) for v in pd.values() if isinstance(v, dict) and v.get("pid")]
        assert len(pids) == 3
    finally:
        assert s.stop() == 0
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)  # no worker outlives its head


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_stages_serve_equals_colocated(colocated: dict[str, object]) -> None:
    s = Server("--gguf", "gemma3-270m", "--stages", "2", boot_timeout=300)
    try:
        assert _run_all(s.url) == colocated
        p = _stats(s.url)["pipeline"]
        # by weight bytes, the LM head (178 MB of Gemma's 247) counting on the last stage
        assert [st["layers"] for st in p["stages"]] == [[0, 17], [17, 18]] and p["head"]["transport"] == "shm"
        assert p["head"]["forwards"] > 0 and p["head"]["in_flight_max"] >= 2  # both groups' steps overlapped
        assert s.metric("fak_pipeline_stages") == 2
        rows = httpx.get(s.url + "/v1/fak/stats", timeout=10).json()["workers"]  # the web console's stage rows
        assert [(w["name"], w["role"], w["layers"]) for w in rows] == [("stage0", "stage", [0, 17]),
                                                                         ("stage1", "stage", [17, 18])]
        assert 0 < s.metric("fak_pipeline_decode_bytes_per_step") <= 640 * 4 * len(PROMPTS)
    finally:
        assert s.stop() == 0


def _fak(*args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FAK_")}
    return subprocess.run([sys.executable, "-m", "commands.main", *args], capture_output=True, text=True, cwd=REPO,
                          env=clean, timeout=120)


@pytest.mark.parametrize("args,msg", [
    (["serve", "--pd", "2:1"], "one prefill worker is supported"),
    (["serve", "--pd", "1:x"], "expected PREFILL:DECODE"),
    (["serve", "--pd", "1:2", "--pd-workers", "127.0.0.1:1,127.0.0.1:2"], "give one"),
    (["serve", "--pd", "1:1", "--pd-transport", "rdma"], "expected shm or tcp"),
    (["serve", "--pd-transport", "tcp"], "needs --pd or --pd-workers"),
    (["serve", "--pd-workers", "nowhere"], "is not HOST:PORT"),
    (["worker", "--role", "router"], "expected one of prefill, decode"),
    (["worker", "--role", "decode", "--listen", "localhost"], "is not HOST:PORT"),
    (["worker", "--role", "stage"], "a stage worker needs its band"),
    (["worker", "--role", "decode", "--layers", "0:3"], "--layers is for --role stage"),
    (["serve", "--stages", "2", "--pd", "1:1"], "need --ray"),
    (["serve", "--stages", "2", "--stage-transport", "ib"], "expected inproc, shm or tcp"),
    (["serve", "--micro-batches", "2"], "need --stages"),
    (["serve", "--stages", "3", "--cuts", "9"], "makes 2 stages, --stages says 3"),
    (["serve", "--cuts", "9,x"], "expected layer indices"),
    (["serve", "--stage-workers", "127.0.0.1:1", "--cuts", "9"], "drop --stages / --cuts"),
    (["serve", "--stage-workers", "h:1", "--stage-transport", "inproc"], "tcp or shm"),
    (["serve", "--ray", "auto"], "--ray needs --stages N"),
    (["serve", "--ray", "auto", "--pd-workers", "h:1,h:2"], "drop --pd-workers"),
    (["serve", "--ray", "auto", "--stages", "2", "--stage-transport", "shm"], "talk over tcp"),
])
def test_bad_pd_flags_are_one_line_exit_2(args: list[str], msg: str) -> None:
    r = _fak(*args, "--port", "0") if args[0] == "serve" else _fak(*args)
    assert r.returncode == 2, r.stderr
    assert msg in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_bad_cut_for_the_model_is_one_line_exit_2() -> None:
    r = _fak("serve", "--port", "0", "--gguf", "synthetic", "--cuts", "30")
    assert r.returncode == 2 and "must be in 1.." in r.stderr and "Traceback" not in r.stderr


def test_pd_workers_unreachable_is_one_line_exit_2() -> None:
    r = _fak("serve", "--port", "0", "--gguf", "synthetic", "--pd-workers", "127.0.0.1:1,127.0.0.1:2")
    assert r.returncode == 2 and "--pd-workers 127.0.0.1:1" in r.stderr and "Traceback" not in r.stderr
