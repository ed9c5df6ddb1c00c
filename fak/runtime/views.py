"""Rich renderings of engine statistics (scheduler, preemption, prefix cache) for the CLI and dashboards."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from engine.sched.stats import SchedStats


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _bar(used: int, total: int | None, width: int = 20) -> Text:
    if not total:
        return Text(f"{used} blocks (growable)")
    frac = min(1.0, used / total)
    filled = round(frac * width)
    style = "green" if frac < 0.7 else "yellow" if frac < 0.9 else "red"
    return Text.assemble(("█" * filled, style), ("░" * (width - filled), "dim"), f" {used}/{total}")


def sched_table(s: SchedStats) -> Table:
    limit = "unbounded" if not s.max_running else str(s.max_running)
    t = Table(title="scheduler", show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold cyan", no_wrap=True)
    t.add_column()
    t.add_row("lanes", f"{s.running} running · {s.waiting} waiting · {s.preempted} preempted "
                       f"(max {limit}, peak {s.max_running_observed})")
    t.add_row("throughput", f"{s.tokens_per_s:.1f} tok/s · {s.tokens_generated} generated · "
                            f"{s.prefill_tokens} prefilled · {s.steps} steps")
    t.add_row("kv blocks", _bar(s.used_blocks, s.max_blocks))
    t.add_row("", f"{s.block_tokens} tokens/block · {s.cached_blocks} cached ({s.reclaimable_blocks} reclaimable)")
    rate = f"{100 * s.prefix_hits / s.prefix_queries:.0f}%" if s.prefix_queries else "-"
    t.add_row("prefix cache", f"{s.prefix_hits}/{s.prefix_queries} hits ({rate}) · {s.prefix_hit_tokens} tokens reused")
    if s.kv_disk_files or s.kv_disk_hits or s.kv_disk_enabled:
        state = "" if s.kv_disk_enabled else " · off (write failed)"
        refused = f" · {s.kv_disk_refused} refused" if s.kv_disk_refused else ""
        t.add_row("kv on disk", f"{s.kv_disk_files} blocks, {_bytes(s.kv_disk_bytes)} · {s.kv_disk_hits} read back "
                                f"({_bytes(s.kv_disk_bytes_read)}){refused}{state}")
    if s.speculative != "off":
        acc = f"{100 * s.spec_accepted / s.spec_drafted:.0f}%" if s.spec_drafted else "-"
        per = f"{s.spec_emitted / s.spec_lane_steps:.2f}" if s.spec_lane_steps else "-"
        t.add_row("speculative", f"{s.speculative} · {s.spec_accepted}/{s.spec_drafted} drafted tokens kept ({acc}) · "
                                 f"{per} tokens per drafting step")
    done = ", ".join(f"{k} {v}" for k, v in sorted(s.finished.items())) or "-"
    t.add_row("requests", f"{s.admitted} admitted · finished: {done}")
    return t


def preemption_table(s: SchedStats) -> Table:
    t = Table(title="preemption", show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold magenta", no_wrap=True)
    t.add_column()
    t.add_row("policy", f"{s.preempt_mode} · victim {s.victim_rule}")
    t.add_row("preemptions", f"swap {s.preemptions_swap} · recompute {s.preemptions_recompute} · "
                             f"readmitted {s.readmitted}")
    t.add_row("swap traffic", f"out {_bytes(s.swap_bytes_out)} · in {_bytes(s.swap_bytes_in)}")
    v = s.last_victim
    if v is None:
        t.add_row("last victim", "-")
    else:
        cost = "" if v.cost is None else f" · cost {v.cost:.4g}"
        t.add_row("last victim", f"lane {v.seq} by {v.rule} ({v.mode}){cost}: {v.reason}")
    return t


def sched_panel(s: SchedStats) -> Panel:
    """Scheduler + preemption stats in one panel (used by `fak serve` dashboards and `fak run` stats)."""
    return Panel(Group(sched_table(s), Text(""), preemption_table(s)), title="fak engine", expand=False)


def serve_view(s: SchedStats | None, url: str, requests: float, errors: float, model: str, status: str = "",
               pd: dict[str, Any] | None = None, pipeline: dict[str, Any] | None = None) -> object:
    """What `fak serve --live` and `fak top` draw: the engine panel (the decode workers' sum under P/D), the
    P/D or pipeline panel when there is one, and one line of request counts."""
    if s is None:
        return Text(f"fak serve {url}: {status or 'loading'}")
    line = Text(f"{url} · {requests:.0f} requests · {errors:.0f} 5xx · model {model}")
    extra = ([pd_panel(pd)] if pd else []) + ([pipeline_panel(pipeline)] if pipeline else [])
    return Group(sched_panel(s), *extra, line)


def pipeline_panel(stats: dict[str, Any]) -> Panel:
    """A pipeline's figures (engine/pipeline/metrics.py): a row per stage, then the links' bytes per step."""
    t = Table(box=None, pad_edge=False)
    for col in ("stage", "layers", "steps", "step time", "utilisation", "bubble", "rows", "in"):
        t.add_column(col, justify="right" if col not in ("stage", "layers") else "left")
    for i, st in enumerate(stats.get("stages", [])):
        lo, hi = st.get("layers", [0, 0])
        steps = st.get("steps", 0)
        mean = f"{1e3 * st.get('busy_s', 0.0) / steps:.2f} ms" if steps else "-"
        down = "" if st.get("up", True) else " [bold red]DOWN[/]"
        t.add_row(f"{i}{down}", f"{lo}:{hi}", f"{steps:.0f}", mean, f"{100 * st.get('utilisation', 0.0):.0f}%",
                  f"{100 * st.get('bubble', 0.0):.0f}%", f"{st.get('rows', 0):.0f}", _bytes(st.get("bytes_in", 0)))
    h = stats.get("head", {})
    line = Text(f"{h.get('transport', '?')} links · {h.get('micro_batches', 0)} micro-batches · "
                f"{h.get('forwards', 0):.0f} forwards · decode step {h.get('decode_bytes_per_step', 0):.0f} B rows + "
                f"{h.get('decode_header_bytes_per_step', 0):.0f} B header per link")
    return Panel(Group(t, line), title="fak pipeline", expand=False)


def fetch_stats(url: str, headers: dict[str, str]) -> dict[str, Any]:
    import httpx

    from fak.errors import FakError

    try:
        r = httpx.get(url.rstrip("/") + "/fak/stats", headers=headers, timeout=5)
    except httpx.HTTPError as exc:
        raise FakError(f"{url}: cannot reach fak serve ({exc})") from None
    if r.status_code != 200:
        raise FakError(f"{url}/fak/stats: HTTP {r.status_code} ({r.text[:120]})")
    return dict(r.json())


def stats_view(url: str, d: dict[str, Any]) -> object:
    from engine.sched.stats import SchedStats

    s = SchedStats.from_json(d["sched"]) if d.get("sched") else None
    return serve_view(s, url, d.get("requests", 0), d.get("errors_5xx", 0), d.get("model", ""), d.get("status", ""),
                      d.get("pd"), d.get("pipeline"))


def _worker_table(name: str, w: dict[str, Any]) -> Table:
    where = f" {w['address']}" if w.get("address") else ""
    state = "" if w.get("up", True) else " [bold red]DOWN[/]"
    t = Table(title=f"{name} ({w.get('role', '?')}{where}){state}", show_header=False, box=None, pad_edge=False,
              title_justify="left")
    t.add_column(style="bold cyan", no_wrap=True)
    t.add_column()
    if w.get("role") == "prefill":
        t.add_row("requests", f"{w.get('requests', 0)} requests · {w.get('prefill_tokens', 0)} tokens prefilled · "
                              f"{w.get('hit_tokens', 0)} from its prefix cache")
        t.add_row("exported", f"{w.get('blocks_out', 0)} blocks · {_bytes(w.get('bytes_out', 0))}")
        return t
    imports, secs = w.get("imports", 0), w.get("transfer_s", 0.0)
    mean = f"{1e3 * secs / imports:.2f} ms/import" if imports else "-"
    rate = f"{w.get('bytes', 0) / secs / 1e9:.2f} GB/s" if secs else "-"
    t.add_row("requests", f"{w.get('requests', 0)} requests · {imports} imports · {w.get('refused', 0)} refused · "
                          f"{w.get('import_waits', 0)} waits")
    t.add_row("moved", f"{w.get('blocks', 0)} blocks · {_bytes(w.get('bytes', 0))}")
    t.add_row("residency", f"{w.get('skipped_blocks', 0)} blocks skipped (already held) · "
                           f"{w.get('held_blocks', 0)} reserved")
    t.add_row("transfer", f"{1e3 * secs:.1f} ms · {mean} · {rate}")
    t.add_row("decode side", f"{w.get('prefill_tokens', 0)} tokens prefilled · {w.get('imported', 0)} lanes imported")
    return t


def pd_panel(stats: dict[str, Any]) -> Panel:
    """A P/D cluster's `stats()` (engine/pd/cluster.py): a table per worker and the router's routes."""
    parts: list[Any] = []
    workers = [("prefill", stats["prefill"])] if "prefill" in stats else []
    workers += sorted((k, v) for k, v in stats.items() if isinstance(v, dict) and v.get("role") == "decode")
    for name, w in workers:
        parts += [_worker_table(name, w), Text("")]
    r = stats.get("router", {})
    parts.append(Text(f"routes: prefix {r.get('prefix', 0)} · least-loaded {r.get('least-loaded', 0)} · "
                      f"balance {r.get('balance', 0)}"))
    h = stats.get("head")
    if h:  # across processes: what the head did about workers going down
        parts.append(Text(f"workers down {h.get('down', 0)} · requests resumed {h.get('resumed', 0)} "
                          f"({h.get('failed_over', 0)} mid-stream)"))
    return Panel(Group(*parts), title="fak P/D", expand=False)
