"""`fak top`: the live engine view of a running `fak serve`, drawn from its /fak/stats route."""

from __future__ import annotations

import os
import time

import typer


def register(app: typer.Typer) -> None:
    @app.command("top")
    def top(
        url: str = typer.Option("http://127.0.0.1:8000", "--url", help="The fak serve to watch."),
        api_key: str | None = typer.Option(None, "--api-key", help="Its API key [FAK_API_KEY]."),
        interval: float = typer.Option(0.5, "--interval", help="Seconds between refreshes."),
        once: bool = typer.Option(False, "--once", help="Draw once and exit."),
    ) -> None:
        """Watch a running fak serve: lanes, KV blocks, prefix hits, preemptions, tok/s, requests."""
        from rich.console import Console
        from rich.live import Live

        from fak.errors import FakError
        from fak.runtime.views import fetch_stats, stats_view

        if not interval > 0:
            raise FakError(f"--interval {interval}: expected a positive number of seconds")
        key = api_key or os.environ.get("FAK_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        if once:
            Console().print(stats_view(url, fetch_stats(url, headers)))
            return
        with Live(stats_view(url, fetch_stats(url, headers)), refresh_per_second=4) as live:
            while True:
                time.sleep(interval)
                live.update(stats_view(url, fetch_stats(url, headers)))
