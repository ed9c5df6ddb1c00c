"""Server logs: one line per event on stderr, plain text or (--json-logs) one JSON object per line.

The access log (method, route, status, duration, client) is written by the app's middleware to the
`fak.access` logger; uvicorn's own loggers (errors, startup) go through the same handler, so with
--json-logs every line a log shipper sees parses.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

ACCESS = logging.getLogger("fak.access")
SERVER = logging.getLogger("fak.serve")
_FIELDS = ("method", "path", "route", "status", "duration_ms", "client", "url", "model")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": round(record.created, 3), "level": record.levelname.lower(),
                               "logger": record.name, "msg": record.getMessage()}
        for key in _FIELDS:
            if hasattr(record, key):
                out[key] = getattr(record, key)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(out, separators=(",", ":"), ensure_ascii=False)


def setup(json_logs: bool, access: bool | None = None) -> logging.Handler:
    """Route fak's and uvicorn's loggers to one stderr handler. The access log is on with json_logs
    (a machine reads it) unless `access` says otherwise."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_logs else logging.Formatter("%(message)s"))
    for name in ("fak", "uvicorn", "uvicorn.error"):
        lg = logging.getLogger(name)
        lg.handlers[:] = [handler]
        lg.propagate = False
        lg.setLevel(logging.INFO if name == "fak" else logging.WARNING)
    ACCESS.disabled = not (json_logs if access is None else access)
    logging.getLogger("uvicorn.access").disabled = True  # ours carries the route and duration
    return handler


def access(scope: dict[str, Any], route: str, status: int, started: float) -> None:
    if ACCESS.disabled:
        return
    client = scope.get("client")
    ms = round((time.perf_counter() - started) * 1000, 2)
    method, path = scope.get("method", ""), scope.get("path", "")
    ACCESS.info(f"{method} {path} {status} {ms} ms", extra={
        "method": method, "path": path, "route": route, "status": status, "duration_ms": ms,
        "client": f"{client[0]}:{client[1]}" if client else None})
