"""POST /commands/batch and GET /batches/{batch_id}: commands in bulk, each decided once, the
batch's outcomes read from the owner of its batch_id's partition of ``batches``."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

import shared.http.paths  # noqa: F401  (registers the {name:id} path convertor)
from services.validator.command_batch import CommandBatch
from services.validator.models import BatchAccepted, BatchStatus, CommandBatchIn
from services.validator.outcome_records import PENDING
from services.validator.routes.common import IdPath, ask_owner, validator
from shared.engine import SendFailed
from shared.http.context import ServiceContext
from shared.http.deps import Ctx, owned_key
from shared.http.errors import NotFound, Unavailable, Unprocessable, error_responses
from shared.http.forwarding import owner_of
from shared.http.pagination import CursorParam, InvalidCursor, decode_cursor, encode_cursor

router = APIRouter()


BATCH_ITEMS = "batch-items"
#: How often POST /commands/batch?wait=true looks at the batch's outcomes.
BATCH_POLL_S = 0.05


def batch_status_body(
    batch_id: str, ids: list[str], outcomes: dict[int, dict[str, Any]], *, start: int, limit: int
) -> dict[str, Any]:
    """GET /batches/{batch_id}: counts over every item, and the items from ``start`` on."""
    counts = {PENDING: 0, "accepted": 0, "rejected": 0}
    by_reason: dict[str, int] = {}
    items: list[dict[str, Any]] = []
    for index, command_id in enumerate(ids):
        outcome = outcomes.get(index)
        status = outcome["status"] if outcome is not None else PENDING
        counts[status] += 1
        if status == "rejected" and outcome is not None:
            by_reason[outcome["reason"]] = by_reason.get(outcome["reason"], 0) + 1
        if start <= index < start + limit:
            items.append(
                {
                    "index": index,
                    "command_id": command_id,
                    "status": status,
                    "reason": outcome.get("reason") if outcome else None,
                    "detail": outcome.get("detail") if outcome else None,
                    "version": outcome.get("version") if outcome else None,
                }
            )
    end = start + len(items)
    return {
        "batch_id": batch_id,
        "total": len(ids),
        "counts": {**counts, "rejected_by_reason": by_reason},
        "items": items,
        "next_cursor": encode_cursor(str(end - 1), BATCH_ITEMS) if items and end < len(ids) else None,
    }


async def batch_status(ctx: ServiceContext, batch_id: str, *, start: int, limit: int) -> dict[str, Any] | None:
    """The batch's status from the instance that owns it (None: no such batch yet)."""
    svc = validator(ctx)
    owner = owner_of(ctx, svc.command_batches.store, ctx.partition_for(batch_id))
    if owner == ctx.url:
        if not ctx.ready():
            raise Unavailable("state is being restored; retry shortly")
        found = svc.command_batches.batch_summary(batch_id)
        if found is None:
            return None
        ids, outcomes = found
        return batch_status_body(batch_id, ids, outcomes, start=start, limit=limit)
    params: dict[str, Any] = {"limit": limit}
    if start > 0:
        params["cursor"] = encode_cursor(str(start - 1), BATCH_ITEMS)
    return await ask_owner(ctx, owner, f"/batches/{quote(batch_id, safe='')}", params, within_s=ctx.settings.forward_timeout_s)


@router.post(
    "/commands/batch",
    status_code=202,
    response_model=BatchAccepted,
    summary="Submit a batch of commands; each is decided once, like a single command",
    responses={
        200: {"model": BatchStatus, "description": "With ?wait=true: every item's outcome"},
        202: {"description": "Written to account-command-batches; with ?wait=true and items still pending, their status"},
        **error_responses(
            400,
            413,
            422,
            503,
            _422="The body is not a batch (batch_id, 1 to STATEFLEET_BATCH_MAX_COMMANDS commands)",
            _503="The batch could not be written to Kafka; retry (resending decides only what was not decided)",
        ),
    },
)
async def post_batch(
    body: CommandBatchIn,
    ctx: Ctx,
    wait: Annotated[bool, Query(description="Wait (up to the configured timeout) for every item's outcome")] = False,
) -> Any:
    limit = ctx.settings.batch_max_commands
    if len(body.commands) > limit:
        raise Unprocessable(f"a batch holds at most {limit} commands, got {len(body.commands)}")
    svc = validator(ctx)
    command_batch = CommandBatch(batch_id=body.batch_id, items=tuple(body.commands))
    try:
        await svc.command_batches.submit(command_batch)
    except SendFailed as exc:
        raise Unavailable(f"the batch could not be written to Kafka: {exc}") from exc
    accepted = {"batch_id": command_batch.batch_id, "command_ids": command_batch.command_ids()}
    if not wait:
        return JSONResponse(accepted, status_code=202)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ctx.settings.command_wait_timeout_s
    status: dict[str, Any] | None = None
    while loop.time() < deadline:
        with contextlib.suppress(Unavailable):
            status = await batch_status(ctx, command_batch.batch_id, start=0, limit=limit)
        if status is not None and status["counts"][PENDING] == 0:
            return JSONResponse(status, status_code=200)
        await asyncio.sleep(BATCH_POLL_S)
    return JSONResponse(status or accepted, status_code=202)


async def _batch_id(batch_id: IdPath) -> str:
    return batch_id


#: A batch id this instance answers for (the owner of its partition of command batches).
Batch = Annotated[str, owned_key(_batch_id, lambda ctx: validator(ctx).command_batches.store)]


@router.get(
    "/batches/{batch_id:id}",
    response_model=BatchStatus,
    summary="A batch's counts by outcome and its items' outcomes, in pages",
    responses=error_responses(
        400, 404, 422, 503, _400="A cursor this API did not make", _404="No batch with this id was received"
    ),
)
async def get_batch(
    batch_id: Batch, ctx: Ctx, limit: Annotated[int, Query(ge=1, le=1000)] = 100, cursor: CursorParam = None
) -> Any:
    start = 0
    text = decode_cursor(cursor, BATCH_ITEMS)
    if text is not None:
        if not text.isdigit():
            raise InvalidCursor("cursor is not one this API returned")
        start = int(text) + 1
    found = validator(ctx).command_batches.batch_summary(batch_id)
    if found is None:
        raise NotFound(f"no batch {batch_id!r}")
    ids, outcomes = found
    return batch_status_body(batch_id, ids, outcomes, start=start, limit=limit)


#: The routes of the bundled accounts domain.
