"""The web console `fak serve` shows at `/` (static files in fak/console/, no CDN) and the JSON
routes it draws from:

- GET  /v1/fak/stats      the engine, once a second: scheduler snapshot, KV blocks vs budget,
                          prefix hit rate, preemptions, TTFT / ITL percentiles, kernel counters, P/D workers;
- GET  /v1/fak/decisions  the tail of the kernel's decisions (tool, verdict, reason, by, time), filterable;
- POST /v1/fak/audit/verify  the `fak audit verify` check on the journal `--journal` writes.

The page and its two assets are public (the page asks for the API key once and keeps it in
sessionStorage); every JSON route is behind the key like the rest of the API.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from importlib.resources import files
from typing import Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import Response

from fak.core.abi import VerdictKind
from fak.gateway.errors import APIError

STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
          "/console/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/console/app.css": ("app.css", "text/css; charset=utf-8")}
STATIC_PATHS = tuple(STATIC)  # public: the auth middleware lets them through
# the page may load and call nothing but this server (no CDN, no inline script), nor be framed
HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
           "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'"}
QUANTILES = (0.5, 0.9, 0.99)

router = APIRouter()


class DecisionTap:
    """Stands in the kernel's journal slot: every record goes on to the real journal (when
    `--journal` gave one; its errors still refuse the call) and the last `size` stay in memory
    for the console, with the verdict's detail the journal line leaves out."""

    def __init__(self, inner: Any, size: int = 1000) -> None:
        self.inner, self._ring, self._lock, self._n = inner, deque(maxlen=size), threading.Lock(), 0

    @property
    def path(self) -> Any:
        return getattr(self.inner, "path", None)

    def record(self, call: Any, verdict: Any, phase: str = "submit") -> str | None:
        digest = self.inner.record(call, verdict, phase) if self.inner is not None else None
        with self._lock:
            self._n += 1
            self._ring.append({"id": self._n, "time": round(time.time(), 3), "phase": phase, "seq_no": call.seq_no,
                               "trace_id": call.trace_id, "tool": call.tool, "verdict": verdict.kind.value,
                               "reason": verdict.reason.value, "detail": verdict.detail, "by": verdict.by,
                               "source": str(call.meta.get("source", "")), "hash": digest})
        return digest

    def tail(self, limit: int, verdict: str | None = None, tool: str | None = None) -> tuple[list[dict[str, Any]], int]:
        """(the newest `limit` matching records, newest first; how many decisions were seen in all)."""
        with self._lock:
            rows, total = list(self._ring), self._n
        out = [r for r in reversed(rows) if (verdict is None or r["verdict"] == verdict)
               and (tool is None or r["tool"].lower() == tool.lower())]
        return out[:limit], total

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


def install(app: FastAPI) -> None:
    """Add the console's routes to `app` and put a DecisionTap in its kernel's journal slot."""
    kernel = app.state.kernel
    if not isinstance(kernel.journal, DecisionTap):
        kernel.journal = DecisionTap(kernel.journal)
    app.state.decisions = kernel.journal
    app.include_router(router)


def _static(name: str, media: str) -> Any:
    body = (files("fak") / "console" / name).read_bytes()  # read once: the files ship in the package

    async def serve() -> Response:
        return Response(body, media_type=media, headers=HEADERS)

    return serve


for _path, (_name, _media) in STATIC.items():
    router.add_api_route(_path, _static(_name, _media), methods=["GET"], include_in_schema=False)


def histogram_quantiles(hist: Any, qs: tuple[float, ...] = QUANTILES) -> dict[str, Any]:
    """Percentiles of a prometheus_client Histogram (all its label sets), interpolated inside the
    bucket as Prometheus' histogram_quantile does; None when nothing was observed."""
    buckets: dict[float, float] = {}
    count = total = 0.0
    for metric in hist.collect():
        for s in metric.samples:
            if s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
            elif s.name.endswith("_count"):
                count += s.value
            elif s.name.endswith("_sum"):
                total += s.value
    out: dict[str, Any] = {"count": int(count), "mean": total / count if count else None}
    bounds = sorted(buckets)
    for q in qs:
        key = f"p{round(q * 100):d}"
        if not count:
            out[key] = None
            continue
        rank, lo, below = q * count, 0.0, 0.0
        for le in bounds:
            cum = buckets[le]
            if cum >= rank:
                if le == float("inf"):  # past the last finite bound: the bound is all that is known
                    out[key] = lo
                else:
                    out[key] = lo + (le - lo) * ((rank - below) / (cum - below) if cum > below else 1.0)
                break
            lo, below = le, cum
    return out


def _workers(b: Any) -> list[dict[str, Any]]:
    """One row per worker when the engine is split (its topology()): P/D workers (in PDCluster.pd_stats()'s
    shape) and pipeline stages (what /fak/stats reports under "pipeline")."""
    from engine.sched.api import split_stats

    split = split_stats(b.scheduler if b is not None else None)
    pd, pipe = split["pd"], split["pipeline"]
    rows = [{"name": k, **v} for k, v in pd.items() if isinstance(v, dict) and "role" in v] if pd is not None else []
    for i, stage in enumerate(pipe["stages"] if pipe else []):
        rows.append({"name": f"stage{i}", "role": "stage", **stage})
    return rows


@router.get("/v1/fak/stats")
async def stats(request: Request) -> dict[str, Any]:
    """What the console's engine view draws, one snapshot (counters are since the server started)."""
    st = request.app.state
    b = st.booted
    s = b.scheduler.stats().to_json() if b is not None and b.scheduler is not None else None
    total, errors_5xx = st.metrics.request_counts()
    out: dict[str, Any] = {"model": st.config.model_name, "status": st.boot_status, "time": time.time(),
                           "requests": total, "errors_5xx": errors_5xx, "sched": s,
                           "kernel": st.kernel.stats(), "workers": _workers(b),
                           "ttft_s": histogram_quantiles(st.metrics.ttft), "itl_s": histogram_quantiles(st.metrics.itl)}
    if s is not None:
        queries = s["prefix_queries"]
        out["kv"] = {"used": s["used_blocks"] - s["reclaimable_blocks"], "cached": s["cached_blocks"],
                     "budget": s["max_blocks"] or s["pool_blocks"], "growable": s["max_blocks"] is None}
        out["prefix_hit_rate"] = s["prefix_hits"] / queries if queries else None
        drafted = s["spec_drafted"]
        out["spec"] = {"mode": s["speculative"], "acceptance": s["spec_accepted"] / drafted if drafted else None,
                       "tokens_per_step": s["spec_emitted"] / s["spec_lane_steps"] if s["spec_lane_steps"] else None}
    return out


@router.get("/v1/fak/decisions")
async def decisions(request: Request, limit: int = Query(100, ge=1, le=1000),
                    verdict: VerdictKind | None = None,
                    tool: str | None = Query(None, min_length=1, max_length=256)) -> dict[str, Any]:
    """The newest decisions first (since the server started), filtered by verdict and/or tool name."""
    tap: DecisionTap = request.app.state.decisions
    rows, seen = tap.tail(limit, verdict.value if verdict is not None else None, tool)
    path = tap.path
    return {"decisions": rows, "seen": seen, "journal": str(path) if path is not None else None}


@router.post("/v1/fak/audit/verify", responses={404: {"description": "no journal (fak serve --journal FILE)"},
                                                503: {"description": "the journal cannot be read"}})
async def verify(request: Request) -> dict[str, Any]:
    """`fak audit verify` on the journal this server writes: the hash chain from its first record."""
    from fak.core.journal import verify as verify_journal
    from fak.errors import FakError

    path = request.app.state.decisions.path
    if path is None:
        raise APIError(404, "no journal to verify: start fak serve with --journal FILE", code="no_journal")
    try:
        report = await asyncio.to_thread(verify_journal, path)
    except FakError as exc:
        raise APIError(503, str(exc), type="server_error", code="journal_error") from None
    return {"journal": str(path), "ok": report.ok, "records": report.records, "bad_line": report.bad_line,
            "problem": report.problem, "truncated_line": report.truncated_line, "summary": report.summary(str(path))}
