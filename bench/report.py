"""Benchmarks as pictures: run the benches, draw PNG charts into docs/img/, write docs/benchmarks.md.

    python bench/report.py [--only membw,decode,prefill,serve,pd,pipeline] [--quick] [--from DIR] [--out docs]
                           [--models gemma3-270m,qwen2.5-coder-0.5b] [--prefill-sizes 512,2048,4096]
                           [--llama-server PATH | --no-llama]

Each bench runs as a subprocess with `--json PATH`; its figures, the command, the machine (CPU, cores), the
date and the git commit are saved as one record per run under OUT/img/data/NAME.json (its printed output
beside it, NAME.log). The charts and the markdown are then drawn from every record in that directory, so
`--only serve` measures serve again and redraws the rest from their earlier records (each chart's footer says
when and on what it was measured). `--from DIR` draws from saved records without running anything.

Groups (--only): membw (stream-read ceiling), decode (bench/decode.py per model: lanes, bytes/token, share of
the ceiling), prefill (bench/longctx.py per model at --prefill-sizes), serve (bench/serve.py, streams 1/4/16),
pd (bench/pd.py: colocated vs P/D arms), pipeline (bench/pipeline.py: 1 vs 2 stages).

llama.cpp: with `--llama-server PATH`, or `llama-server` on PATH (or built by `bench/longctx.py --build-llama`),
the prefill and serve charts get llama.cpp's figures on the same GGUF side by side; without one the markdown
says so. A bench that fails is reported in one line and left out of the charts ("not measured").

The default sizes take about 15 minutes on a 2-core machine (more with llama.cpp: it runs the same prefill and
serve loads again); --quick takes a couple of minutes and is a smoke run, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen
from matplotlib.figure import Figure  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ("membw", "decode", "prefill", "serve", "pd", "pipeline")
PD_ARMS = {"colo": "colocated", "pd1": "P/D threads", "pd1s": "P/D threads, split cores",
           "proc1": "P/D processes 1:1", "proc2": "P/D processes 1:2"}


# ---------------------------------------------------------------- where and when


@dataclass
class Machine:
    cpu: str
    cores: int
    date: str
    commit: str

    def footer(self) -> str:
        return f"{self.cpu}, {self.cores} cores · {self.date} · commit {self.commit}"


def git_commit() -> str:
    """Short hash of HEAD, "+dirty" when the working tree differs from it (untracked files do not count)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def this_machine() -> Machine:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return Machine(cpu, cores, time.strftime("%Y-%m-%d %H:%M"), git_commit())


# ---------------------------------------------------------------- running the benches


@dataclass
class Job:
    name: str  # the record's file stem, e.g. decode-gemma3-270m
    group: str
    argv: list[str]  # after `python`: the script and its flags (--json is added)
    model: str = ""
    llama_peer: int = 0  # serve: start llama-server with this many slots and pass it as --peer


@dataclass
class Record:
    name: str
    group: str
    command: str
    machine: Machine
    seconds: float = 0.0
    error: str | None = None  # why it was not measured
    result: dict[str, Any] = field(default_factory=dict)
    quick: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class Sizes:
    membw: list[str]
    decode: list[str]
    prefill_new: int
    serve: list[str]
    pd: list[str]
    pipeline: list[str]


# Default sizes are picked so the whole report is ~15 minutes on 2 cores; each is still large enough that the
# figure is the steady state (decode.py's 3 rounds take medians; pd's long prompts are 1-2k tokens as in issue 17).
FULL = Sizes(membw=["--mib", "512", "--reps", "7"],
             decode=["--runs", "3", "--decode", "128", "--batch-steps", "32", "--lanes", "1,4,16", "--prefill", "0"],
             prefill_new=32,
             serve=["--levels", "1,4,16", "--new", "128"],
             pd=["--arms", "colo,pd1s,proc1", "--short", "8", "--new", "128", "--long", "4", "--long-min", "1024",
                 "--long-max", "2048", "--rounds", "2"],
             pipeline=["--arms", "1x1,1x2,2x2,2x4", "--lanes", "16", "--new", "64", "--rounds", "2"])
QUICK = Sizes(membw=["--mib", "128", "--reps", "3"],
              decode=["--runs", "1", "--decode", "16", "--batch-steps", "4", "--lanes", "1,4,16", "--prefill", "0"],
              prefill_new=8,
              serve=["--levels", "1,4,16", "--new", "8"],
              pd=["--arms", "colo,pd1s,proc1", "--short", "4", "--new", "32", "--long", "2", "--long-min", "256",
                  "--long-max", "512", "--rounds", "1"],
              pipeline=["--arms", "1x1,2x2", "--lanes", "4", "--new", "16", "--rounds", "1"])


def plan(groups: list[str], sizes: Sizes, models: list[str], prefill_sizes: str, llama: str | None) -> list[Job]:
    jobs: list[Job] = []
    if "membw" in groups:
        jobs.append(Job("membw", "membw", ["bench/membw.py", *sizes.membw]))
    for m in models if "decode" in groups else []:
        jobs.append(Job(f"decode-{m}", "decode", ["bench/decode.py", "--model", m, *sizes.decode], m))
    for m in models if "prefill" in groups else []:
        who = ["--llama-server", llama] if llama else ["--no-llama"]
        jobs.append(Job(f"prefill-{m}", "prefill", ["bench/longctx.py", "--model", m, "--sizes", prefill_sizes,
                                                    "--new", str(sizes.prefill_new), *who], m))
    if "serve" in groups:
        levels = [int(x) for x in sizes.serve[sizes.serve.index("--levels") + 1].split(",")]
        jobs.append(Job("serve", "serve", ["bench/serve.py", "--model", models[0], *sizes.serve], models[0],
                        llama_peer=max(levels) if llama else 0))
    if "pd" in groups:
        jobs.append(Job("pd", "pd", ["bench/pd.py", "--model", models[0], *sizes.pd], models[0]))
    if "pipeline" in groups:
        jobs.append(Job("pipeline", "pipeline", ["bench/pipeline.py", "--model", models[0], *sizes.pipeline], models[0]))
    return jobs


@contextmanager
def llama_peer(binary: str, model: str, slots: int) -> Iterator[str]:
    """llama-server on the same GGUF with one slot per concurrent stream (serve.py's --peer)."""
    from longctx import Llama  # bench/longctx.py: the same launcher as its side-by-side runs (and the repo on sys.path)

    from engine.gguf.aliases import resolve_model

    srv = Llama(binary, str(resolve_model(model)), ctx=slots * 512, parallel=slots)  # 512 per slot: prompt + new
    try:
        yield srv.url
    finally:
        srv.stop()


def run(job: Job, data: Path, llama: str | None, timeout: float, quick: bool) -> Record:
    out = data / f"{job.name}.json"
    out.unlink(missing_ok=True)
    shown = " ".join(["python", *job.argv])
    rec = Record(job.name, job.group, shown, this_machine(), quick=quick)
    # the benches import this checkout's engine/ and fak/ (not an installed copy): the repo root goes first
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    t0 = time.monotonic()
    print(f"report: {job.name}: {shown}", flush=True)
    try:
        with llama_peer(llama, job.model, job.llama_peer) if (llama and job.llama_peer) else nullcontext() as peer:
            argv = [*job.argv, *(["--peer", peer] if peer else []), "--json", str(out)]
            if peer:
                rec.command = f"{shown} --peer <llama-server -np {job.llama_peer} on the same GGUF>"
            with (data / f"{job.name}.log").open("w") as log:
                returncode = run_bench(argv, env, log, timeout)
        if returncode != 0:
            rec.error = f"exit {returncode}: {why_failed((data / f'{job.name}.log').read_text(errors='replace'))}"
        elif not out.exists():
            rec.error = "no JSON written"
        else:
            rec.result = json.loads(out.read_text())
    except subprocess.TimeoutExpired:
        rec.error = f"timed out after {timeout:.0f} s"
    except (OSError, SystemExit, RuntimeError, ValueError) as e:  # e.g. llama-server would not start
        rec.error = f"{type(e).__name__}: {e}"
    rec.seconds = time.monotonic() - t0
    if rec.error:
        print(f"report: {job.name} not measured ({rec.error})", flush=True)
    else:
        print(f"report: {job.name} done in {rec.seconds:.0f} s", flush=True)
    out.write_text(json.dumps(asdict(rec), indent=1))  # the bench's own JSON, wrapped in its record
    return rec


def run_bench(argv: list[str], env: dict[str, str], log: IO[str], timeout: float) -> int:
    """The bench in a session of its own: on a timeout or ^C its whole group goes (the fak serve or workers it
    started included), not just the Python process at its top."""
    p = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
        return p.wait(timeout)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def why_failed(log: str) -> str:
    """The line that says why: a traceback's exception line (httpx adds a help line after it), else the last line."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b:?", ln)]
    return (errors or lines or ["no output"])[-1][:200]


def load(data: Path) -> dict[str, Record]:
    recs: dict[str, Record] = {}
    for f in sorted(data.glob("*.json")):
        try:
            d = json.loads(f.read_text())
            recs[d["name"]] = Record(d["name"], d["group"], d["command"], Machine(**d["machine"]), d["seconds"],
                                     d["error"], d["result"], d.get("quick", False))
        except (ValueError, KeyError, TypeError) as e:
            print(f"report: {f} is not a report record ({e}); skipped")
    return recs


# ---------------------------------------------------------------- charts: one function each


@dataclass
class Section:
    title: str
    image: str | None  # file name under img/, None when nothing was measured
    table: list[list[str]]  # header row first
    commands: list[str]
    notes: list[str] = field(default_factory=list)


def footer(recs: list[Record]) -> str:
    """One line for a chart drawn from one or more records: machine, date(s), commit(s)."""
    ms = [r.machine for r in recs]
    machines = sorted({f"{m.cpu}, {m.cores} cores" for m in ms})
    dates = sorted({m.date for m in ms})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    commits = ", ".join(dict.fromkeys(m.commit for m in ms))
    quick = " · --quick (smoke sizes, not a measurement)" if any(r.quick for r in recs) else ""
    return f"measured on {' / '.join(machines)} · {when} · commit {commits}{quick}"


def save(fig: Figure, recs: list[Record], img: Path, name: str) -> str:
    fig.text(0.01, 0.01, footer(recs), fontsize=7.5, color="0.35", va="bottom")
    fig.tight_layout(rect=(0, 0.045, 1, 1))
    fig.savefig(img / name, dpi=110)
    plt.close(fig)
    return name


def missing(title: str, recs: list[Record], wanted: str) -> Section:
    why = "; ".join(f"{r.name}: {r.error}" for r in recs if r.error) or f"no record ({wanted} not run)"
    return Section(title, None, [], [r.command for r in recs], [f"Not measured: {why}."])


def f1(x: float | None, unit: str = "") -> str:
    return "–" if x is None or x != x else f"{x:,.1f}{unit}"


def by_group(recs: dict[str, Record], group: str) -> list[Record]:
    return [r for r in recs.values() if r.group == group]


def chart_decode_lanes(recs: dict[str, Record], img: Path) -> Section:
    title = "Decode throughput vs lanes"
    rs = by_group(recs, "decode")
    ok = [r for r in rs if r.ok]
    if not ok:
        return missing(title, rs, "decode")
    fig, ax = plt.subplots(figsize=(7, 4.2))
    table = [["model", "single-lane decode tok/s", *[f"{n} lane{'s' * (n > 1)} tok/s" for n in lanes_of(ok)],
              f"{lanes_of(ok)[-1]} lanes / single-lane"]]
    for r in ok:
        lanes = {int(k): v for k, v in r.result["lanes_tps"].items()}
        xs = sorted(lanes)
        ax.plot(xs, [lanes[x] for x in xs], marker="o", label=r.result["model"])
        for x in xs:
            ax.annotate(f"{lanes[x]:.0f}", (x, lanes[x]), textcoords="offset points", xytext=(0, 6), ha="center",
                        fontsize=8)
        table.append([r.result["model"], f1(r.result["decode_tps"]), *[f1(lanes.get(n)) for n in lanes_of(ok)],
                      f"{lanes[max(lanes)] / r.result['decode_tps']:.2f}x"])
    ax.set_xscale("log", base=2)
    ax.set_xticks(lanes_of(ok), [str(n) for n in lanes_of(ok)])
    ax.set_xlabel("concurrent lanes (one step_batch for all)")
    ax.set_ylabel("aggregate decode (tok/s)")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.12)  # room for the labels over the points
    ax.grid(alpha=0.3)
    ax.legend(title="model (resident)")
    ax.set_title(f"{title} (bench/decode.py)")
    return Section(title, save(fig, ok, img, "decode_lanes.png"), table, [r.command for r in rs],
                   ["Aggregate tokens per second when every lane advances one token per step; the weights are read "
                    "once per step for all lanes, so more lanes should mean more tokens for the same bytes."])


def lanes_of(rs: list[Record]) -> list[int]:
    return sorted({int(k) for r in rs for k in r.result["lanes_tps"]})


def chart_bandwidth(recs: dict[str, Record], img: Path) -> Section:
    title = "Share of the memory-bandwidth ceiling (single-lane decode)"
    rs = by_group(recs, "decode")
    ok = [r for r in rs if r.ok]
    mem = recs.get("membw")
    if not ok:
        return missing(title, rs, "decode")
    fig, ax = plt.subplots(figsize=(7, 4.2))
    names = [r.result["model"] for r in ok]
    shares = [100 * r.result["share"] for r in ok]
    bars = ax.bar(names, shares, color="tab:blue", width=0.5)
    for b, r in zip(bars, ok, strict=True):
        ax.text(b.get_x() + b.get_width() / 2, b.get_height() / 2,
                f"{r.result['share']:.0%}\n{r.result['weights_gbps']:.1f} of\n{r.result['ceiling_gbps']:.1f} GB/s",
                ha="center", va="center", color="white", fontsize=9, fontweight="bold")
    ax.axhline(100, color="0.3", ls="--", lw=1, label="stream-read ceiling, measured in the same rounds")
    ax.set_ylabel("weights read per second / ceiling (%)")
    ax.set_ylim(0, max(120.0, max(shares) * 1.25))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(f"{title}\n(bench/decode.py; ceiling: numba stream read, all threads)", fontsize=10)
    table = [["model", "MiB read / token", "decode tok/s", "weights GB/s", "ceiling GB/s", "share", "ceiling tok/s"]]
    for r in ok:
        x = r.result
        table.append([x["model"], f1(x["bytes_per_token"] / 2**20), f1(x["decode_tps"]), f"{x['weights_gbps']:.2f}",
                      f"{x['ceiling_gbps']:.2f}", f"{x['share']:.0%}", f1(x["ceiling_gbps"] * 1e9 / x["bytes_per_token"])])
    notes = ["Bytes per token are the weight bytes one decode step reads (every layer, the head, one embedding row); "
             "the share is the median over rounds of (tok/s x bytes/token) / the stream-read GB/s measured right "
             "before that round's decode. Above 100% means the weights read faster than the plain read did in that "
             "round (part of them cached, or the shared host's bandwidth moving between the two)."]
    used = list(ok)
    if mem is not None and mem.ok:
        used.append(mem)
        per = ", ".join(f"{t} thread{'s' * (int(t) > 1)} {g:.1f} GB/s" for t, g in mem.result["gbps_by_threads"].items())
        notes.append(f"bench/membw.py ({mem.result['mib']} MiB buffer): {per}.")
    elif mem is not None:
        notes.append(f"bench/membw.py not measured: {mem.error}.")
    return Section(title, save(fig, used, img, "bandwidth_share.png"), table,
                   [r.command for r in rs] + ([mem.command] if mem else []), notes)


def chart_prefill(recs: dict[str, Record], img: Path) -> Section:
    title = "Prefill throughput vs prompt length"
    rs = by_group(recs, "prefill")
    ok = [r for r in rs if r.ok]
    if not ok:
        return missing(title, rs, "prefill")
    fig, ax = plt.subplots(figsize=(7, 4.2))
    table = [["model", "prompt tokens", "fak prefill tok/s", "fak cold TTFT s", "llama.cpp prefill tok/s",
              "fak / llama.cpp"]]
    any_llama = False
    for i, r in enumerate(ok):
        color = f"C{i}"
        fak = {int(k): v for k, v in r.result["fak"].items()}
        llama = {int(k): v for k, v in (r.result.get("llama") or {}).items()}
        xs = sorted(fak)
        ax.plot(xs, [fak[x]["cold_prefill_tps"] for x in xs], marker="o", color=color, label=f"fak, {r.result['model']}")
        if llama:
            any_llama = True
            ax.plot(xs, [llama[x]["cold_prefill_tps"] for x in xs], marker="s", ls="--", color=color,
                    label=f"llama.cpp, {r.result['model']}")
        for x in xs:
            lp = llama[x]["cold_prefill_tps"] if x in llama else None
            table.append([r.result["model"], str(x), f1(fak[x]["cold_prefill_tps"]), f"{fak[x]['cold_ttft_s']:.2f}",
                          f1(lp), f"{fak[x]['cold_prefill_tps'] / lp:.2f}x" if lp else "–"])
    ax.set_xscale("log", base=2)
    sizes = sorted({int(k) for r in ok for k in r.result["fak"]})
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_xlabel("prompt length (tokens, cold: nothing cached)")
    ax.set_ylabel("prefill (tok/s = tokens / TTFT)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{title} (bench/longctx.py, one stream)")
    notes = ["Each prompt is fresh text (this repository's code) sent as token ids to `fak serve`; prefill tok/s is "
             "prompt tokens / time to first token, so it includes the HTTP round trip and the first decode step."]
    if not any_llama:
        notes.append("llama.cpp: not measured (no `llama-server` on PATH; `--llama-server PATH`, or "
                     "`python bench/longctx.py --build-llama` once, adds it side by side).")
    return Section(title, save(fig, ok, img, "prefill_ctx.png"), table, [r.command for r in rs], notes)


def chart_serve(recs: dict[str, Record], img: Path) -> Section:
    title = "fak serve under concurrent streams"
    r = recs.get("serve")
    if r is None or not r.ok:
        return missing(title, [r] if r else [], "serve")
    rows = r.result["levels"]
    xs = [row["streams"] for row in rows]
    peer = r.result.get("peer") is not None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2))
    a1.plot(xs, [row["fak"]["tps"] for row in rows], marker="o", label="fak serve")
    a2.plot(xs, [1e3 * row["fak"]["itl_p50_s"] for row in rows], marker="o", color="C0", label="fak ITL p50")
    a2.plot(xs, [1e3 * row["fak"]["itl_p99_s"] for row in rows], marker="^", ls=":", color="C0", label="fak ITL p99")
    if peer:
        a1.plot(xs, [row["peer"]["tps"] for row in rows], marker="s", ls="--", color="C1", label="llama-server")
        a2.plot(xs, [1e3 * row["peer"]["itl_p50_s"] for row in rows], marker="s", color="C1", label="llama.cpp ITL p50")
        a2.plot(xs, [1e3 * row["peer"]["itl_p99_s"] for row in rows], marker="v", ls=":", color="C1",
                label="llama.cpp ITL p99")
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("concurrent streaming clients")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    a1.set_ylabel("aggregate tok/s (tokens received / wall)")
    a1.set_title("throughput")
    a2.set_ylabel("inter-token latency per stream (ms)")
    a2.set_title("inter-token latency")
    fig.suptitle(f"{title}: {r.result['model']}, {r.result['new']} new tokens each (bench/serve.py)")
    table = [["streams", "fak tok/s", "TTFT p50 s", "ITL p50 ms", "ITL p99 ms"]
             + (["llama.cpp tok/s", "TTFT p50 s", "ITL p50 ms", "ITL p99 ms", "fak / llama.cpp tok/s"] if peer else [])]
    for row in rows:
        f, p = row["fak"], row.get("peer")
        line = [str(row["streams"]), f1(f["tps"]), f"{f['ttft_p50_s']:.3f}", f1(1e3 * f["itl_p50_s"]),
                f1(1e3 * f["itl_p99_s"])]
        if peer and p:
            line += [f1(p["tps"]), f"{p['ttft_p50_s']:.3f}", f1(1e3 * p["itl_p50_s"]), f1(1e3 * p["itl_p99_s"]),
                     f"{f['tps'] / p['tps']:.2f}x"]
        table.append(line)
    notes = ["Every client streams one greedy completion over HTTP at the same moment; ITL is the gap between "
             "consecutive streamed tokens of one client, pooled over the clients."]
    if not peer:
        notes.append("llama.cpp: not measured (no `llama-server`; `--llama-server PATH` runs the same load against it, "
                     "alternated level by level).")
    return Section(title, save(fig, [r], img, "serve_streams.png"), table, [r.command], notes)


def chart_pd(recs: dict[str, Record], img: Path) -> Section:
    title = "Prefill/decode disaggregation: decode ITL while long prompts arrive"
    r = recs.get("pd")
    if r is None or not r.ok:
        return missing(title, [r] if r else [], "pd")
    x = r.result
    arms = list(x["arms"])
    labels = [PD_ARMS.get(k, k) for k in arms]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.4))
    pos = range(len(arms))
    p50 = [1e3 * x["arms"][k]["itl_p50_s"] for k in arms]
    p99 = [1e3 * x["arms"][k]["itl_p99_s"] for k in arms]
    a1.bar([i - 0.2 for i in pos], p50, width=0.4, label="ITL p50")
    a1.bar([i + 0.2 for i in pos], p99, width=0.4, label="ITL p99")
    for i in pos:
        a1.annotate(f"{p99[i]:.0f}", (i + 0.2, p99[i]), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
    a1.set_xticks(list(pos), labels, rotation=15, fontsize=8)
    a1.set_ylim(0, max(p99) * 1.12)
    a1.set_ylabel("short requests' inter-token latency (ms)")
    a1.set_title("decode ITL (lower is better)")
    a1.grid(axis="y", alpha=0.3)
    a1.legend(fontsize=8)
    ttft = [x["arms"][k]["long_ttft_p50_s"] for k in arms]
    a2.bar(list(pos), ttft, width=0.5, color="C2")
    a2.set_xticks(list(pos), labels, rotation=15, fontsize=8)
    a2.set_ylabel("long prompts' TTFT p50 (s)")
    a2.set_title("what it costs the long prompts")
    a2.grid(axis="y", alpha=0.3)
    longs = ", ".join(map(str, x["long_prompts"]))
    fig.suptitle(f"{x['short']} short requests x {x['new']} tokens decoding while prompts of {longs} tokens arrive "
                 f"({x['model']}, bench/pd.py)", fontsize=10)
    colo99 = x["arms"]["colo"]["itl_p99_s"] if "colo" in x["arms"] else float("nan")
    table = [["arm", "ITL p50 ms", "ITL p99 ms", "ITL max ms", "long TTFT p50 s", "short tok/s", "ITL p99 vs colocated"]]
    for k in arms:
        a = x["arms"][k]
        table.append([PD_ARMS.get(k, k), f1(1e3 * a["itl_p50_s"]), f1(1e3 * a["itl_p99_s"]), f1(1e3 * a["itl_max_s"]),
                      f"{a['long_ttft_p50_s']:.2f}", f1(a["short_tps"]), f"{a['itl_p99_s'] / colo99:.2f}x"])
    notes = ["Colocated: one scheduler does both (a long prefill chunk sits between two decode steps). P/D threads: a "
             "prefill worker and a decode worker in one process (split cores: numba at 1 thread each). P/D processes: "
             "what `fak serve --pd 1:1` runs, worker processes with the cores split, KV over shared memory. "
             "llama.cpp has no comparable arm here."]
    return Section(title, save(fig, [r], img, "pd_itl.png"), table, [r.command], notes)


def chart_pipeline(recs: dict[str, Record], img: Path) -> Section:
    title = "Pipeline stages: throughput and stage utilisation"
    r = recs.get("pipeline")
    if r is None or not r.ok:
        return missing(title, [r] if r else [], "pipeline")
    x = r.result
    arms = x["arms"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2))
    names = [a["arm"] for a in arms]
    a1.bar(names, [a["tps"] for a in arms], color="C0", width=0.5)
    for i, a in enumerate(arms):
        a1.annotate(f"{a['tps']:.0f} ({a['vs_first']:.2f}x)", (i, a["tps"]), textcoords="offset points", xytext=(0, 3),
                    ha="center", fontsize=8)
    a1.set_xlabel("arm: stages x lane groups in flight")
    a1.set_ylim(0, max(a["tps"] for a in arms) * 1.12)
    a1.set_ylabel("aggregate decode (tok/s)")
    a1.set_title("throughput")
    a1.grid(axis="y", alpha=0.3)
    width = 0.35
    labelled: set[int] = set()
    for i, a in enumerate(arms):
        n = len(a["stage"])
        for s, st in enumerate(a["stage"]):  # an arm's stages side by side, centred on its tick
            a2.bar(i + (s - (n - 1) / 2) * width, 100 * st["utilisation"], width=width, color=f"C{s}",
                   label=None if s in labelled else f"stage {s + 1}")
            labelled.add(s)
    a2.set_xticks(range(len(arms)), names)
    a2.set_xlabel("arm: stages x lane groups in flight")
    a2.set_ylabel("busy time / wall time (%)")
    a2.set_ylim(0, 110)
    a2.set_title("stage utilisation (100% - bubble)")
    a2.grid(axis="y", alpha=0.3)
    a2.legend(fontsize=8)
    fig.suptitle(f"{x['lanes']} lanes x {x['new']} tokens, one core per stage process, {x['transport']} links "
                 f"({x['model']}, bench/pipeline.py)", fontsize=10)
    table = [["arm", "tok/s", f"vs {names[0]}", "stages: layers, utilisation", "bytes / decode step on the link"]]
    for a in arms:
        st = "; ".join(f"{s['layers'][0]}:{s['layers'][1]}{' +head' if s['head'] else ''} {s['utilisation']:.0%}"
                       for s in a["stage"])
        table.append([a["arm"], f1(a["tps"]), f"{a['vs_first']:.2f}x", st, f"{a['decode_bytes_per_step']:,.0f}"])
    notes = ["Each stage is a `fak worker --role stage` process pinned to one core; with 2 groups in flight the "
             "stages can work on different lane groups at once, which is where a second stage can pay."]
    return Section(title, save(fig, [r], img, "pipeline_stages.png"), table, [r.command], notes)


# ---------------------------------------------------------------- the markdown


def markdown(sections: list[Section], llama: str | None, ran: bool, quick: bool) -> str:
    out = ["# Benchmarks", "",
           "Measured with `python bench/report.py` (the charts, these tables and the saved figures under "
           "`img/data/` come from one run of the benches named under each chart; `--from docs/img/data` redraws "
           "them). Every chart's footer names the machine, the date and the git commit it was measured on. These "
           "are small shared machines: expect 10-20% from run to run, more on memory bandwidth.", ""]
    if ran:
        said = f"`{llama}`, run side by side where a chart shows it" if llama else \
            "not found (no `llama-server` on PATH, no `--llama-server`): fak only"
        out += [f"llama.cpp: {said}.", ""]
    if quick:
        out += ["**Some figures below come from a `--quick` run (smoke sizes): they show that the benches run, "
                "not how fast fak is.**", ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        if s.image:
            out += [f"![{s.title}](img/{s.image})", ""]
        if len(s.table) > 1:
            out += ["| " + " | ".join(s.table[0]) + " |", "|" + "|".join("---" for _ in s.table[0]) + "|"]
            out += ["| " + " | ".join(row) + " |" for row in s.table[1:]]
            out.append("")
        out += [n + "\n" for n in s.notes]
        if s.commands:
            out += ["```", *s.commands, "```", ""]
    return "\n".join(out).rstrip() + "\n"


CHARTS = {"decode": (chart_decode_lanes, chart_bandwidth), "prefill": (chart_prefill,), "serve": (chart_serve,),
          "pd": (chart_pd,), "pipeline": (chart_pipeline,)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(GROUPS), help=f"groups to run: {','.join(GROUPS)}")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of a couple of minutes")
    ap.add_argument("--from", dest="from_dir", metavar="DIR", help="redraw from saved records, run nothing")
    ap.add_argument("--out", default=str(ROOT / "docs"), help="writes OUT/benchmarks.md and OUT/img/")
    ap.add_argument("--models", default="gemma3-270m,qwen2.5-coder-0.5b", help="decode/prefill models; serve, pd and "
                    "pipeline use the first")
    ap.add_argument("--prefill-sizes", default=None, help="prompt lengths for the prefill chart (default 512,2048,4096; "
                    "quick 128,256; e.g. 2048,8192,16384 to go bigger)")
    ap.add_argument("--llama-server", default=None, help="llama.cpp's server binary (default: llama-server on PATH)")
    ap.add_argument("--no-llama", action="store_true", help="fak only, even where llama-server is found")
    ap.add_argument("--timeout", type=float, default=None, help="per bench, seconds (default 1800; quick 600)")
    a = ap.parse_args()
    groups = [g for g in a.only.split(",") if g]
    if bad := [g for g in groups if g not in GROUPS]:
        raise SystemExit(f"bench/report.py: --only {','.join(bad)}: not a group ({', '.join(GROUPS)})")
    out = Path(a.out)
    img = out / "img"
    data = Path(a.from_dir) if a.from_dir else img / "data"
    img.mkdir(parents=True, exist_ok=True)
    llama: str | None = None
    if not a.from_dir:
        data.mkdir(parents=True, exist_ok=True)
        if not a.no_llama:
            from longctx import find_llama  # PATH, then the copy `bench/longctx.py --build-llama` leaves in ~/.cache

            llama = find_llama(a.llama_server, build=False)
        sizes = QUICK if a.quick else FULL
        prefill_sizes = a.prefill_sizes or ("128,256" if a.quick else "512,2048,4096")
        models = [m for m in a.models.split(",") if m]
        t0 = time.monotonic()
        print(f"report: {this_machine().footer()}; llama.cpp: {llama or 'none found'}", flush=True)
        for job in plan(groups, sizes, models, prefill_sizes, llama):
            run(job, data, llama, a.timeout or (600 if a.quick else 1800), a.quick)
        print(f"report: benches took {(time.monotonic() - t0) / 60:.1f} min", flush=True)
    recs = load(data)
    if not recs:
        raise SystemExit(f"bench/report.py: no records in {data}")
    sections = [chart(recs, img) for g in GROUPS if g in CHARTS for chart in CHARTS[g]]
    md = out / "benchmarks.md"
    md.write_text(markdown(sections, llama, ran=not a.from_dir, quick=any(r.quick for r in recs.values())))
    drawn = [s.image for s in sections if s.image]
    print(f"report: wrote {md} and {len(drawn)} charts in {img} ({', '.join(drawn)})")


if __name__ == "__main__":
    main()
