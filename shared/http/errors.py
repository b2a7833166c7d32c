"""Errors as JSON: every 4xx and 5xx body is ``{"error": code, "detail": ...}``."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class ApiError(Exception):
    """Base of the errors a handler raises on purpose; ``status`` becomes the HTTP status."""

    status = 400
    code = "bad_request"

    def __init__(self, detail: Any = None, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail if detail is not None else self.code
        self.headers = headers or {}


class NotFound(ApiError):
    status = 404
    code = "not_found"


class Unauthorized(ApiError):
    status = 401
    code = "unauthorized"

    def __init__(self, detail: Any = "a valid 'Authorization: Bearer <token>' header is required") -> None:
        super().__init__(detail, headers={"WWW-Authenticate": "Bearer"})


class Conflict(ApiError):
    status = 409
    code = "conflict"


class PayloadTooLarge(ApiError):
    status = 413
    code = "payload_too_large"


class Unavailable(ApiError):
    """State is not there to answer from yet (recovering, rebalancing, owner unknown)."""

    status = 503
    code = "unavailable"

    def __init__(self, detail: Any = "state is being restored or rebalanced; retry shortly", retry_after: int = 1) -> None:
        super().__init__(detail, headers={"Retry-After": str(retry_after)})


def error_body(code: str, detail: Any) -> dict[str, Any]:
    return {"error": code, "detail": detail}


class ErrorResponse(JSONResponse):
    """A JSON error that renders whatever the request held: a field name or value with a
    lone surrogate (``"\\ud800"``, which JSON parsers accept) has no UTF-8 form, so it is
    written replaced rather than failing the error response itself."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=str).encode(
            "utf-8", errors="replace",
        )


def install_error_handlers(api: FastAPI) -> None:
    @api.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return ErrorResponse(error_body(exc.code, exc.detail), status_code=exc.status, headers=exc.headers)

    @api.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in exc.errors()
        ]
        return ErrorResponse(error_body("invalid_request", errors), status_code=422)

    @api.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return ErrorResponse(error_body(code, exc.detail), status_code=exc.status_code, headers=exc.headers)

    @api.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return ErrorResponse(error_body("internal_error", "unexpected error; see the service log"), status_code=500)
