"""What every route of the retry scheduler's API shares: its path and query parameters,
its documented errors, the service, and how a command's answer becomes a response."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query
from fastapi.responses import JSONResponse

from services.retry_scheduler.app import RetrySchedulerService
from services.retry_scheduler.entries import Entry
from services.retry_scheduler.models import CommandOut
from services.retry_scheduler.routes.auth import ACT, allow
from services.retry_scheduler.tokens import Token
from shared.engine import Table
from shared.http.context import ServiceContext, service_of
from shared.http.deps import Located, located_key
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
AUTH: Responses = error_responses(
    401, 403, _403="The token lacks the act scope on the origin topic: the body names the token, the topic and the scope"
)
#: What a read of a message's payload may answer besides its own (with STATEFLEET_PAYLOADS_REQUIRE_TOKEN).
READ_AUTH: Responses = error_responses(
    401,
    403,
    _401="STATEFLEET_PAYLOADS_REQUIRE_TOKEN is on and the call carries no valid 'Authorization: Bearer <token>'",
    _403="The token lacks the read scope on the message's origin topic: the body names the token, the topic and the scope",
)
#: What a list may answer besides its own: 401 for a token that is not valid (without one, payloads it must hide are left out).
LIST_AUTH: Responses = error_responses(401, _401="The call carries a bearer token that is not valid")
BUSY: Responses = error_responses(503)
LIST_ERRORS: Responses = error_responses(400, 422, 503, _400="A cursor this API did not make")
ACCEPTED: Responses = {202: {"model": CommandOut, "description": "Accepted; applied shortly"}}
COMMAND_BUSY: Responses = error_responses(
    503, _503="Owner recovering or rebalancing, or the redelivery failed (the message is kept); retry"
)


def command_responses(not_found: str) -> Responses:
    """What a command on one message answers: 202, 401, 403, 404 (``not_found``), 422 and 503."""
    return {**ACCEPTED, **AUTH, **error_responses(404, 422, _404=not_found), **COMMAND_BUSY}


def scheduler(ctx: ServiceContext) -> RetrySchedulerService:
    """The retry scheduler service behind ``ctx``."""
    return service_of(ctx, RetrySchedulerService)


async def _dlq_id(dlq_id: DlqId) -> str:
    return dlq_id


def _places_of(ctx: ServiceContext, dlq_id: str) -> list[int]:
    """Where a message may be: its id's partition, and with ordered retries on, every other
    (a dead letter of an ordered topic lives in its key's partition, which its id does not tell)."""
    svc = scheduler(ctx)
    home = svc.state.partition_of(dlq_id)
    if not svc.routing.ordered_topics:
        return [home]
    return [home, *(p for p in range(ctx.settings.topic_partitions) if p != home)]


def _holds(ctx: ServiceContext, dlq_id: str, partition: int) -> bool:
    return scheduler(ctx).stats.knows(dlq_id, partition)


def _schedule(ctx: ServiceContext) -> Table:
    return scheduler(ctx).state.schedule


#: A dlq.id this instance answers a read of (the owner of the partition it is in, or a copy).
ReadId = Annotated[Located, located_key(_dlq_id, _schedule, _places_of, _holds)]
#: A dlq.id this instance applies a command to (the active owner of the partition it is in).
CommandId = Annotated[Located, located_key(_dlq_id, _schedule, _places_of, _holds, reads=False)]


async def command_on(ctx: ServiceContext, kind: bytes, letter: Located, token: Token, *, held: Entry | None, what: str) -> Any:
    """Send command ``kind`` for the message through the inbox of its partition and answer as
    its handler did; 404 unless the message is ``what`` it must be (``held``, its stored entry),
    403 unless ``token`` may act on its origin topic. The token's name is the actor its history records."""
    if held is None:
        raise NotFound(f"no {what} message with dlq.id {letter.key!r}")
    allow(ctx, token, ACT, held.origin_topic)
    result = await scheduler(ctx).commands.request(
        kind, letter.key, letter.partition, ctx.settings.forward_timeout_s, actor=token.name
    )
    status = result.get("status")
    if status == "not_found":
        raise NotFound(f"no such message with dlq.id {result['id']!r}")
    if status == "failed":
        raise Unavailable(f"redelivery failed, the message is kept: {result.get('detail')}")
    if status == "accepted":
        return JSONResponse(result, status_code=202)
    return result
