"""What every route of the retry scheduler's API shares: its path and query parameters,
its documented errors, the service, and how a command's answer becomes a response."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query
from fastapi.responses import JSONResponse

from services.retry_scheduler.app import RetrySchedulerService
from services.retry_scheduler.models import CommandOut
from shared.http.errors import NotFound, Unavailable, error_responses
from shared.http.pagination import CursorParam

#: Most entries one partition examines for one list request (filters can skip many).
SCAN_BUDGET = 50_000
MAX_ID_LENGTH = 1024

DlqId = Annotated[str, Path(min_length=1, max_length=MAX_ID_LENGTH, description="dlq.id")]
Limit = Annotated[int, Query(ge=1, le=1000)]
Cursor = CursorParam
OriginTopic = Annotated[str | None, Query(min_length=1, max_length=249, description="Only messages from this topic")]

Responses = dict[int | str, dict[str, Any]]
AUTH: Responses = error_responses(401)
BUSY: Responses = error_responses(503)
LIST_ERRORS: Responses = error_responses(400, 422, 503, _400="A cursor this API did not make")
ACCEPTED: Responses = {202: {"model": CommandOut, "description": "Accepted; applied shortly"}}
COMMAND_BUSY: Responses = error_responses(
    503, _503="Owner recovering or rebalancing, or the redelivery failed (the message is kept); retry",
)


def service_of(ctx: Any) -> RetrySchedulerService:
    svc: RetrySchedulerService = ctx.extras["service"]
    return svc


def command_answer(result: dict[str, Any]) -> Any:
    status = result.get("status")
    if status == "not_found":
        raise NotFound(f"no such message with dlq.id {result['id']!r}")
    if status == "failed":
        raise Unavailable(f"redelivery failed, the message is kept: {result.get('detail')}")
    if status == "accepted":
        return JSONResponse(result, status_code=202)
    return result
