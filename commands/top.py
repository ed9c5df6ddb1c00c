"""`fak top`: the live engine view of a running `fak serve`, drawn from its /fak/stats route."""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("top")
    def top(
        url: str = typer.Option("http://127.0.0.1:8000", "--url", help="The fak serve to watch."),
        api_key: Optional[str] = typer.Option(None, "--api-key", help="Its API key [FAK_API_KEY]."),
        interval: float = typer.Option(0.5, "--interval", help="Seconds between refreshes."),
        once: bool = typer.Option(False, "--once", help="Draw once and exit."),
    ) -> None:
        """Watch a running fak serve: lanes, KV blocks, prefix hits, preemptions, tok/s, requests."""
        from rich.console import Console
        from rich.live import Live

        from fak.errors import FakError

        if not interval > 0:
            raise FakError(f"--interval {interval}: expected a positive number of seconds")
        key = api_key or os.environ.get("FAK_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        if once:
            Console().print(_view(url, _fetch(url, headers)))
            return
        with Live(_view(url, _fetch(url, headers)), refresh_per_second=4) as live:
            while True:
                time.sleep(interval)
                live.update(_view(url, _fetch(url, headers)))


def _fetch(url: str, headers: dict[str, str]) -> dict[str, Any]:
    import httpx

    from fak.errors import FakError

    try:
        r = httpx.get(url.rstrip("/") + "/fak/stats", headers=headers, timeout=5)
    except httpx.HTTPError as exc:
        raise FakError(f"{url}: cannot reach fak serve ({exc})") from None
    if r.status_code != 200:
        raise FakError(f"{url}/fak/stats: HTTP {r.status_code} ({r.text[:120]})")
    return dict(r.json())


def _view(url: str, d: dict[str, Any]) -> object:
    from engine.sched.stats import SchedStats
    from fak.views import serve_view

    s = SchedStats.from_json(d["sched"]) if d.get("sched") else None
    return serve_view(s, url, d.get("requests", 0), d.get("errors_5xx", 0), d.get("model", ""), d.get("status", ""))
