"""Errors in the OpenAI envelope: {"error": {"message", "type", "param", "code"}}, never a traceback;
on the Anthropic routes (/v1/messages...) in Anthropic's: {"type": "error", "error": {"type", "message"}}.

Validation failures (pydantic) become a 400 naming the field; APIError carries the status and the
envelope's fields for everything the handlers reject themselves.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


class APIError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers


def envelope(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


ANTHROPIC_PREFIX = "/v1/messages"
_ANTHROPIC_TYPES = {"server_error": "api_error", "service_unavailable": "overloaded_error"}


def shaped(path: str, message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The error body the route's wire expects."""
    if path.startswith(ANTHROPIC_PREFIX):
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(type, type), "message": message}}
    return envelope(message, type, param, code)


def _field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"


def install(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(shaped(request.url.path, exc.message, exc.type, exc.param, exc.code),
                            status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0] if exc.errors() else {"loc": ("body",), "msg": "invalid request"}
        field = _field(tuple(err.get("loc", ())))
        msg = str(err.get("msg", "invalid value"))
        if err.get("type") == "json_invalid":
            field, msg = "body", f"malformed JSON ({err.get('ctx', {}).get('error', msg)})"
        elif err.get("type") == "extra_forbidden":
            msg = "unknown field"
        return JSONResponse(shaped(request.url.path, f"{field}: {msg}", "invalid_request_error", field), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(shaped(request.url.path, str(exc.detail), kind), status_code=exc.status_code)
