"""POST /commands and GET /commands/{command_id}: a command submitted, and its outcome read from
the owner of its command_id's partition of ``outcomes`` (other instances forward)."""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

import shared.http.paths  # noqa: F401  (registers the {name:id} path convertor)
from services.validator.handlers.outcomes import OutcomesBehind
from services.validator.models import CommandAccepted, command_status_model
from services.validator.outcome_records import PENDING
from services.validator.routes.common import IdPath, ask_owner, validator
from shared import codecs
from shared.domain import CommandEnvelope, Domain
from shared.engine import SendFailed
from shared.http.context import ServiceContext
from shared.http.deps import Ctx, MaxLag
from shared.http.errors import NotFound, Unavailable, error_responses
from shared.http.forwarding import FORWARDED_BY, READ_COPY, answer_here, owner_of, read_source

#: POST /commands without ?wait waits at most this long for the command to be readable
#: as pending (so a GET right after the POST finds it); it returns 202 either way.
PENDING_VISIBLE_WAIT_S = 1.0


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
    svc = validator(ctx)
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
    await answer_here(ctx, request, validator(ctx).outcomes.store, ctx.partition_for(command_id))
    return CommandRead(command_id)


def post_command_route(router: APIRouter, domain: Domain[Any]) -> None:
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
    svc = validator(ctx)
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
    svc = validator(ctx)
    raw = svc.outcomes.outcome(read.command_id)
    if raw is None and read_source(request) == "active":
        try:
            raw = await svc.outcomes.outcome_once_applied(read.command_id)
        except OutcomesBehind as exc:
            raise Unavailable(f"{exc}; retry shortly") from exc
    if raw is None:
        raise NotFound(f"no command {read.command_id!r}")
    return status_body(svc.domain, raw)
