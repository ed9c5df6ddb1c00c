"""The request counts the live panel, `fak top` and the console show (fak/gateway/metrics.py)."""

from __future__ import annotations

from fak.gateway.metrics import Metrics


def test_loading_health_polls_are_not_server_errors() -> None:
    m = Metrics("m", stats=lambda: None)
    for route, status, n in (("/health", "503", 4), ("/health", "200", 1), ("/v1/completions", "200", 2),
                             ("/v1/completions", "500", 1), ("/v1/chat/completions", "503", 1)):
        for _ in range(n):
            m.http.labels(route, status).inc()
    assert m.request_counts() == (9.0, 2.0)  # the 500 and a 503 off /health; /health's 503s are not errors
