"""Errors as JSON: every 4xx and 5xx body is ``{"error": code, "detail": ...}``."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
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
        #: More fields of the JSON body, for programs (e.g. the lag of a copy too stale to answer).
        self.extra: dict[str, Any] = {}


class NotFound(ApiError):
    status = 404
    code = "not_found"


class Unauthorized(ApiError):
    status = 401
    code = "unauthorized"

    def __init__(self, detail: Any = "a valid 'Authorization: Bearer <token>' header is required") -> None:
        super().__init__(detail, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(ApiError):
    """A valid token that may not do this; ``extra`` says which token, topic and scope."""

    status = 403
    code = "forbidden"


class Conflict(ApiError):
    status = 409
    code = "conflict"


class PayloadTooLarge(ApiError):
    status = 413
    code = "payload_too_large"


class Unprocessable(ApiError):
    """A body that matches the schema but breaks a limit the schema cannot say (a configured one)."""

    status = 422
    code = "invalid_request"


class Unavailable(ApiError):
    """State is not there to answer from yet (recovering, rebalancing, owner unknown)."""

    status = 503
    code = "unavailable"

    def __init__(self, detail: Any = "state is being restored or rebalanced; retry shortly", retry_after: int = 1) -> None:
        super().__init__(detail, headers={"Retry-After": str(retry_after)})


class ErrorOut(BaseModel):
    """The body of every 4xx and 5xx answer."""

    error: str = Field(
        description=(
            "What went wrong, for programs: bad_request, invalid_cursor, unauthorized, forbidden, not_found, "
            "method_not_allowed, conflict, payload_too_large, invalid_request, unavailable"
        )
    )
    detail: Any = Field(description="For people: a message, or for invalid_request the list of problems found")
    lag: int | None = Field(
        None,
        description=("With 503 for ?max_lag: changelog records the freshest copy that could answer is behind (null: not known)"),
    )
    max_lag: int | None = Field(None, description="With 503 for ?max_lag: the max_lag asked for")
    token: str | None = Field(None, description="With 403: the name of the token the call carried")
    topic: str | None = Field(None, description="With 403: the origin topic the token does not cover for that scope")
    scope: str | None = Field(None, description="With 401 and 403: the scope needed (read or act)")


ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "Malformed request: a cursor this API did not make, a body that cannot be parsed, a forbidden character",
    401: "Missing or wrong 'Authorization: Bearer <token>' header",
    403: "The token is valid but lacks the scope on the message's origin topic: the body names the token, the "
    "topic and the scope",
    404: "No such resource",
    405: "Method not allowed on this path; the Allow header lists those that are",
    409: "Conflicts with the current state",
    413: "Request body larger than the configured limit",
    422: "A parameter or the body does not match the schema",
    503: "State is being restored or rebalanced, or Kafka is unreachable: retry after Retry-After seconds",
}

_ERROR_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    405: {"Allow": {"description": "The methods this path takes", "schema": {"type": "string"}}},
    503: {"Retry-After": {"description": "Seconds to wait before retrying", "schema": {"type": "string"}}},
}


def error_responses(*statuses: int, **descriptions: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for these error statuses, each with the shared :class:`ErrorOut` body.

    ``descriptions`` override the generic text per status (``_404="No such account"``).
    """
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {"model": ErrorOut, "description": descriptions.get(f"_{status}", ERROR_DESCRIPTIONS[status])}
        if status in _ERROR_HEADERS:
            entry["headers"] = _ERROR_HEADERS[status]
        out[status] = entry
    return out


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
_TEMPLATE_PARAM = re.compile(r"\\\{[^}]*\\\}")


def allowed_methods(request: Request) -> list[str]:
    """The methods of the resource this path names, as the OpenAPI document lists them.

    Ids may hold ``/``, so ``/parked/x/replay`` is both "replay parked message x" and
    "parked message x/replay", and ``/retries/stats`` both the stats and message
    "stats". The reading that takes the path most literally names the resource: no
    slash inside an id if any template matches so, then the fewest ids. (Starlette
    itself names only the methods of the first route that matched the path.)
    """
    path = request.scope.get("path", "")
    paths: dict[str, dict[str, Any]] = request.app.openapi().get("paths", {})
    for param in ("[^/]+", ".+"):
        matching = [
            (template.count("{"), operations)
            for template, operations in paths.items()
            if re.fullmatch(_TEMPLATE_PARAM.sub(param, re.escape(template)), path)
        ]
        if matching:
            fewest = min(n for n, _ in matching)
            methods = {m.upper() for n, operations in matching if n == fewest for m in operations}
            return [m for m in _METHODS if m in methods]
    return []


def error_body(code: str, detail: Any) -> dict[str, Any]:
    return {"error": code, "detail": detail}


class ErrorResponse(JSONResponse):
    """A JSON error that renders whatever the request held: a field name or value with a
    lone surrogate (``"\\ud800"``, which JSON parsers accept) has no UTF-8 form, so it is
    written replaced rather than failing the error response itself."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=str).encode(
            "utf-8", errors="replace"
        )


def install_error_handlers(api: FastAPI) -> None:
    @api.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return ErrorResponse({**error_body(exc.code, exc.detail), **exc.extra}, status_code=exc.status, headers=exc.headers)

    @api.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in exc.errors()]
        return ErrorResponse(error_body("invalid_request", errors), status_code=422)

    @api.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names only the methods of the first route that matched the path;
            # /retries/{id} takes GET from one route and DELETE from another.
            headers["Allow"] = ", ".join(allowed_methods(request)) or headers.get("Allow", "")
        return ErrorResponse(error_body(code, exc.detail), status_code=exc.status_code, headers=headers)

    @api.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return ErrorResponse(error_body("internal_error", "unexpected error; see the service log"), status_code=500)
