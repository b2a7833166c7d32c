"""HTTP: POST /commands, GET /commands/{command_id}, GET /aggregates/{aggregate_id}, batches;
for the accounts domain also GET /accounts/{account_id} and GET /programs/{program_id}/accounts.

:func:`build_router` makes the routes of one domain: ``POST /commands`` takes the domain's
command model (so its OpenAPI is the domain's schema), ``GET /commands/{command_id}`` answers
with the aggregate id under the domain's field.

Any instance answers any id: a command's outcome lives with the owner of its
command_id's partition of ``outcomes``, an aggregate with the owner of its id's
partition of ``accounts``, a program's listing with the owner of its program_id's
partition of ``program-accounts``; other instances forward.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import quote

import httpx
from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse

import shared.http.paths  # noqa: F401  (registers the {name:id} path convertor)
from services.validator.app import ValidatorService
from services.validator.command_batch import CommandBatch
from services.validator.domain import ACCOUNTS, account_json
from services.validator.handlers.outcomes import OutcomesBehind
from services.validator.handlers.program_listings import ProgramListings
from services.validator.models import (
    AccountOut,
    AggregateOut,
    BatchAccepted,
    BatchStatus,
    CommandAccepted,
    CommandBatchIn,
    ProgramAccountsPage,
    command_status_model,
)
from services.validator.outcome_records import PENDING
from services.validator.state import listing_cursor, listing_key_from_cursor
from shared import codecs
from shared.domain import MAX_ID_LENGTH, Aggregate, CommandEnvelope, Domain
from shared.engine import SendFailed
from shared.http.context import ServiceContext
from shared.http.deps import Ctx, MaxLag, owned_key
from shared.http.errors import ApiError, NotFound, Unavailable, Unprocessable, error_responses
from shared.http.forwarding import FORWARDED_BY, READ_COPY, answer_here, owner_of, read_source
from shared.http.pagination import CursorParam, InvalidCursor, decode_cursor, encode_cursor
from shared.metrics import HTTP_FORWARDED

#: The routes of every domain but POST /commands and GET /commands/{command_id} (build_router).
generic = APIRouter()
#: The accounts domain's own reads.
accounts_routes = APIRouter()

#: Ids in paths: none longer is ever accepted, so none longer can be found.
IdPath = Annotated[str, Path(min_length=1, max_length=MAX_ID_LENGTH)]

#: POST /commands without ?wait waits at most this long for the command to be readable
#: as pending (so a GET right after the POST finds it); it returns 202 either way.
PENDING_VISIBLE_WAIT_S = 1.0
#: Names GET /programs/{program_id}/accounts in its cursors.
LISTING = "program-accounts"


def _service(ctx: ServiceContext) -> ValidatorService:
    svc: ValidatorService = ctx.extras["service"]
    return svc


def status_body(domain: Domain[Any], raw: bytes) -> dict[str, Any]:
    """The GET /commands/{command_id} body for a stored outcome record."""
    record = codecs.loads_object(raw)
    rejection = record.get("rejection")
    id_field = domain.message_id_field
    return {
        "command_id": record["command_id"],
        "status": record["status"],
        id_field: record[id_field],
        "event": record.get("event"),
        "rejection": rejection,
        "reason": rejection.get("reason") if rejection else None,
        "detail": rejection.get("detail") if rejection else None,
    }


async def command_status(
    ctx: ServiceContext, command_id: str, *, wait: float, final: bool, forwarded: bool
) -> dict[str, Any] | None:
    """The command's status body from the instance that owns its outcome (None: unknown id).

    With ``wait`` > 0 the owner waits up to that long for an answer (``final``) or for
    any record of the command (not ``final``) before it replies.
    """
    svc = _service(ctx)
    owner = owner_of(ctx, svc.outcomes.store, ctx.partition_for(command_id))
    if owner == ctx.url:
        if not ctx.ready():
            raise Unavailable("state is being restored; retry shortly")
        raw = await svc.outcomes.wait_outcome(command_id, wait, final=final) if wait > 0 else svc.outcomes.outcome(command_id)
        if raw is None:
            try:
                raw = await svc.outcomes.outcome_once_applied(command_id)
            except OutcomesBehind as exc:
                raise Unavailable(f"{exc}; retry shortly") from exc
        return status_body(svc.domain, raw) if raw is not None else None
    if forwarded:
        raise Unavailable("the command's partition moved while the request was forwarded; retry shortly")
    return await ask_owner(
        ctx,
        owner,
        f"/commands/{quote(command_id, safe='')}",
        {"wait": str(wait), "until": "final" if final else "known"},
        within_s=wait + ctx.settings.forward_timeout_s,
    )


async def ask_owner(
    ctx: ServiceContext, owner: str, path: str, params: dict[str, Any], *, within_s: float
) -> dict[str, Any] | None:
    """GET ``path`` from the instance that owns it: its JSON body, or None for its 404."""
    HTTP_FORWARDED.labels(ctx.service).inc()
    try:
        resp = await ctx.http.get(f"{owner}{path}", params=params, headers={FORWARDED_BY: ctx.url}, timeout=within_s)
    except httpx.HTTPError as exc:
        raise Unavailable(f"the owning instance {owner} did not answer; retry shortly") from exc
    if resp.status_code == 404:
        return None
    if resp.status_code != 200:
        raise Unavailable(f"the owning instance {owner} answered {resp.status_code}; retry shortly")
    body: dict[str, Any] = codecs.loads_object(resp.content)
    return body


@dataclass(frozen=True, slots=True)
class CommandRead:
    """GET /commands/{command_id}: the id, and the status its owner answered once it waited for one."""

    command_id: str
    waited: dict[str, Any] | None = None


async def _command_read(
    command_id: IdPath,
    request: Request,
    ctx: Ctx,
    max_lag: MaxLag,
    wait: Annotated[
        float, Query(ge=0, le=60, description="Seconds to wait for an answer (capped by the configured timeout)")
    ] = 0.0,
    until: Annotated[Literal["final", "known"], Query(include_in_schema=False)] = "final",
) -> CommandRead:
    """With ``wait``, the owner of the command's outcome waits for it first; without, or when the
    owner cannot wait, the command is read as any key is (its owner, or the freshest copy)."""
    wait = min(wait, ctx.settings.command_wait_timeout_s)
    if wait > 0 and not request.headers.get(READ_COPY):
        try:
            status = await command_status(
                ctx, command_id, wait=wait, final=until == "final", forwarded=bool(request.headers.get(FORWARDED_BY))
            )
        except Unavailable:
            pass  # the owner cannot wait for it: answered now, from the freshest copy, below
        else:
            if status is None:
                raise NotFound(f"no command {command_id!r}")
            return CommandRead(command_id, status)
    await answer_here(ctx, request, _service(ctx).outcomes.store, ctx.partition_for(command_id))
    return CommandRead(command_id)


def _post_command_route(router: APIRouter, domain: Domain[Any]) -> None:
    status_model = command_status_model(domain)
    id_field, message_id_field = domain.aggregate_id_field, domain.message_id_field

    async def post_command(
        body: CommandEnvelope,
        ctx: Ctx,
        wait: Annotated[bool, Query(description="Wait (up to the configured timeout) for the outcome and return it")] = False,
    ) -> Any:
        command = body.model_dump()
        command["command_id"] = command_id = body.command_id or str(uuid.uuid4())
        if body.issued_at is None:
            command["issued_at"] = int(time.time() * 1000)
        return await submit_command(ctx, command, command_id, command[id_field], message_id_field, wait=wait)

    # The body is the domain's own model (its OpenAPI schema); FastAPI reads it from here.
    post_command.__annotations__["body"] = domain.command_model
    router.post(
        "/commands",
        status_code=202,
        response_model=CommandAccepted,
        summary="Submit a command",
        description=f"A command of the {domain.name} domain; its outcome is an event or a rejection.",
        responses={
            200: {"model": status_model, "description": "With ?wait=true: the command's outcome"},
            202: {
                "description": f"Written to {domain.topics.commands}; with ?wait=true and no outcome in time, the pending status"
            },
            **error_responses(
                400,
                413,
                422,
                503,
                _422="The body is not a valid command, or holds a value no message can carry",
                _503="The command could not be written to Kafka; retry",
            ),
        },
    )(post_command)


async def submit_command(
    ctx: ServiceContext, command: dict[str, Any], command_id: str, aggregate_id: str, id_field: str, *, wait: bool
) -> Any:
    """Write ``command``; without ``wait`` 202 with its id, with ``wait`` its outcome (or pending)."""
    svc = _service(ctx)
    try:
        await svc.commands.submit(command)
    except SendFailed as exc:
        raise Unavailable(f"the command could not be written to Kafka: {exc}") from exc
    if not wait:
        # The command is written either way; its status is readable once the group settles.
        with contextlib.suppress(Unavailable):
            await command_status(ctx, command_id, wait=PENDING_VISIBLE_WAIT_S, final=False, forwarded=False)
        return JSONResponse({"command_id": command_id}, status_code=202)
    try:
        status = await command_status(ctx, command_id, wait=ctx.settings.command_wait_timeout_s, final=True, forwarded=False)
    except Unavailable:
        status = None  # written, but its outcome cannot be read right now: answer as pending
    if status is None or status["status"] == PENDING:
        pending = status or {
            "command_id": command_id,
            "status": PENDING,
            id_field: aggregate_id,
            "event": None,
            "rejection": None,
            "reason": None,
            "detail": None,
        }
        return JSONResponse(pending, status_code=202)
    return JSONResponse(status, status_code=200)


async def get_command(read: Annotated[CommandRead, Depends(_command_read)], request: Request, ctx: Ctx) -> Any:
    if read.waited is not None:
        return read.waited
    svc = _service(ctx)
    raw = svc.outcomes.outcome(read.command_id)
    if raw is None and read_source(request) == "active":
        try:
            raw = await svc.outcomes.outcome_once_applied(read.command_id)
        except OutcomesBehind as exc:
            raise Unavailable(f"{exc}; retry shortly") from exc
    if raw is None:
        raise NotFound(f"no command {read.command_id!r}")
    return status_body(svc.domain, raw)


def build_router(domain: Domain[Any]) -> APIRouter:
    """The validator's routes for ``domain``."""
    router = APIRouter(tags=["validator"])
    _post_command_route(router, domain)
    router.get(
        "/commands/{command_id:id}",
        response_model=command_status_model(domain),
        summary="A command's status: pending, accepted (with its event) or rejected (with the reason)",
        responses=error_responses(
            404,
            422,
            503,
            _404="No command with this id was submitted or answered",
            _503="State is being restored, or the outcomes are still being recorded; retry",
        ),
    )(get_command)
    router.include_router(generic)
    if domain is ACCOUNTS:
        router.include_router(accounts_routes)
    return router


async def _aggregate_id(aggregate_id: IdPath) -> str:
    return aggregate_id


#: An aggregate id this instance answers for (the owner of its partition of the state table).
OwnedAggregate = Annotated[str, owned_key(_aggregate_id, lambda ctx: _service(ctx).commands.store)]


@generic.get(
    "/aggregates/{aggregate_id:id}",
    response_model=AggregateOut,
    summary="An aggregate's current state and version, as the domain's state_to_json gives it",
    responses=error_responses(404, 503, _404="The aggregate never existed"),
)
async def get_aggregate(aggregate_id: OwnedAggregate, ctx: Ctx) -> Any:
    return _service(ctx).domain.aggregate_json(_found(ctx, aggregate_id))


def _found(ctx: ServiceContext, aggregate_id: str) -> Aggregate[Any]:
    """The aggregate (read here, by its owner or from a copy), or 404."""
    svc = _service(ctx)
    aggregate = svc.commands.aggregate(aggregate_id)
    if aggregate is None:
        raise NotFound(f"no {svc.domain.noun} {aggregate_id!r}")
    return aggregate


async def _account_id(account_id: IdPath) -> str:
    return account_id


#: An account id this instance answers for (the owner of its partition of accounts).
Account = Annotated[str, owned_key(_account_id, lambda ctx: _service(ctx).commands.store)]


@accounts_routes.get(
    "/accounts/{account_id:id}",
    response_model=AccountOut,
    summary="An account's current status and version",
    responses=error_responses(404, 503, _404="The account never existed"),
)
async def get_account(account_id: Account, ctx: Ctx) -> Any:
    aggregate = _found(ctx, account_id)
    return account_json(aggregate.aggregate_id, aggregate.version, aggregate.state)


async def _program_id(program_id: IdPath) -> str:
    return program_id


def _listings(ctx: ServiceContext) -> ProgramListings:
    listings = _service(ctx).program_listings
    assert listings is not None, "the program listings are routed for the accounts domain only"
    return listings


def _no_nul(program_id: str) -> None:
    if "\x00" in program_id:
        raise ApiError("program_id must not contain NUL")


#: A program id whose listing this instance answers for (the owner of its partition of program-accounts).
ListedProgram = Annotated[str, owned_key(_program_id, lambda ctx: _listings(ctx).store, check=_no_nul)]


@accounts_routes.get(
    "/programs/{program_id:id}/accounts",
    response_model=ProgramAccountsPage,
    summary="A program's accounts with their status, newest first (the category projection)",
    responses=error_responses(400, 422, 503, _400="A cursor this API did not make, or a program id holding NUL"),
)
async def list_program_accounts(
    program_id: ListedProgram,
    ctx: Ctx,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: CursorParam = None,
    status: Annotated[
        Literal["active", "inactive", "deleted"] | None, Query(description="Only accounts with this status")
    ] = None,
) -> Any:
    before = None
    text = decode_cursor(cursor, LISTING)
    if text is not None:
        try:
            before = listing_key_from_cursor(program_id, text)
        except ValueError as exc:
            raise InvalidCursor("cursor is not one this API returned") from exc
    items, more = _listings(ctx).list_program(program_id, limit=limit, before=before, status=status)
    return {
        "items": [item.to_json() for item in items],
        "next_cursor": encode_cursor(listing_cursor(items[-1]), LISTING) if more and items else None,
    }


# -- batches ---------------------------------------------------------------------------------

#: Cursors of GET /batches/{batch_id} name an item index in this list.
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
    svc = _service(ctx)
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


@generic.post(
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
    svc = _service(ctx)
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
Batch = Annotated[str, owned_key(_batch_id, lambda ctx: _service(ctx).command_batches.store)]


@generic.get(
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
    found = _service(ctx).command_batches.batch_summary(batch_id)
    if found is None:
        raise NotFound(f"no batch {batch_id!r}")
    ids, outcomes = found
    return batch_status_body(batch_id, ids, outcomes, start=start, limit=limit)


#: The routes of the bundled accounts domain.
router = build_router(ACCOUNTS)
