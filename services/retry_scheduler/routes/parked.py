"""HTTP: parked messages (GET /parked, /parked/{id}, replay) and groups of them (GET
/parked/groups, replay or cancel a group), from any instance."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse

import shared.http.paths  # noqa: F401  (registers the {name:id} path convertor)
from services.retry_scheduler.app import RetrySchedulerService
from services.retry_scheduler.domain import MAX_DUE_MS
from services.retry_scheduler.entries import decode_entry
from services.retry_scheduler.handlers.kinds import KIND_DELETE_PARKED, KIND_UNPARK
from services.retry_scheduler.handlers.parking import DELETED, EXPIRED
from services.retry_scheduler.models import CommandOut, GroupActionOut, ParkedGroupsOut, ParkedOut, ParkedPage, entry_json
from services.retry_scheduler.routes.auth import ACT, OPTIONAL_BEARER, READ, Acting, Listing, Reading, allow, listed_entry
from services.retry_scheduler.routes.common import (
    AUTH,
    LIST_AUTH,
    LIST_ERRORS,
    READ_AUTH,
    SCAN_BUDGET,
    CommandId,
    Cursor,
    Limit,
    OriginTopic,
    ReadId,
    command_on,
    command_responses,
    scheduler,
)
from services.retry_scheduler.routes.pages import cursor_after, merge_pages, parked_sort
from services.retry_scheduler.scans import GroupFilter, ParkedGroup, scan_ids, scan_parked_groups
from services.retry_scheduler.state import id_key, id_of
from shared.http.deps import Ctx
from shared.http.errors import NotFound, Unprocessable, error_responses
from shared.http.forwarding import (
    READS_STATE,
    gather,
    is_local_scope,
    local_scope_partitions,
    on_each_owner,
    owned_partitions_named,
)
from shared.http.pagination import decode_cursor, encode_cursor

router = APIRouter(tags=["retries"])

#: Most parked rows one partition examines to group them or count a group (beyond: counts are lower bounds),
#: in steps of GROUP_SCAN_STEP rows.
GROUP_SCAN_BUDGET = 1_000_000
GROUP_SCAN_STEP = 10_000
#: Names GET /parked in its cursors.
PARKED = "parked"


# -- parked ------------------------------------------------------------------------------------------


@router.get(
    "/parked",
    response_model=ParkedPage,
    summary="Parked messages, ordered by dlq.id",
    description="With STATEFLEET_PAYLOADS_REQUIRE_TOKEN, the key and headers of a message whose origin topic the "
    "call's token does not cover with read are left out (payload_hidden).",
    responses={**LIST_ERRORS, **LIST_AUTH},
    dependencies=[READS_STATE],
    openapi_extra=OPTIONAL_BEARER,
)
async def list_parked(
    token: Listing, request: Request, ctx: Ctx, limit: Limit = 100, origin_topic: OriginTopic = None, cursor: Cursor = None
) -> Any:
    svc = scheduler(ctx)
    after_id = decode_cursor(cursor, PARKED)
    after = id_key(after_id) if after_id is not None else None

    async def local(partitions: list[int]) -> dict[str, Any]:
        pages: list[dict[str, Any]] = []
        for p in partitions:
            scan = scan_ids(svc.state.parked.view(p), after=after, limit=limit, origin_topic=origin_topic, budget=SCAN_BUDGET)
            pages.append(
                {
                    "items": [listed_entry(ctx, token, decode_entry(raw)) for _, raw in scan.items],
                    "frontier": id_of(scan.frontier) if scan.frontier is not None else None,
                }
            )
        items, frontier = merge_pages(pages, limit, parked_sort, str)
        return {"items": items, "frontier": frontier}

    if is_local_scope(request):
        # a peer's partial answer: not the public model
        return JSONResponse(await local(await local_scope_partitions(ctx, request, svc.state.schedule, svc.stats.owned())))
    pages = await gather(ctx, request, svc.state.schedule, local)
    items, frontier = merge_pages(pages, limit, parked_sort, str)
    next_cursor = cursor_after(items, limit, frontier, parked_sort, lambda key: encode_cursor(key, PARKED))
    return {"items": items, "next_cursor": next_cursor}


@router.get(
    "/parked/{dlq_id:id}",
    response_model=ParkedOut,
    summary="One parked message",
    responses={**error_responses(404, 422, 503, _404="Not parked (never parked, replayed, deleted or expired)"), **READ_AUTH},
    openapi_extra=OPTIONAL_BEARER,
)
async def get_parked(token: Reading, letter: ReadId, ctx: Ctx) -> Any:
    svc = scheduler(ctx)
    entry = svc.stats.parked_entry(letter.key, letter.partition)
    if entry is None:
        last = svc.stats.last_event(letter.key, letter.partition)
        hint = ""
        if last is not None and last.action in (DELETED, EXPIRED):
            by = f" by {last.actor}" if last.actor else ""
            hint = f" (attempt {last.attempt} was {'deleted' if last.action == DELETED else 'expired'} at {last.at}{by})"
        raise NotFound(f"no parked message with dlq.id {letter.key!r}{hint}")
    if token is not None:
        allow(ctx, token, READ, entry.origin_topic)
    return entry_json(entry, with_value=True)


@router.post(
    "/parked/{dlq_id:id}/replay",
    response_model=CommandOut,
    summary="Redeliver a parked message to its retry topic (dlq.attempt unchanged) and unpark it",
    responses=command_responses("Not parked"),
)
async def replay_parked(token: Acting, letter: CommandId, ctx: Ctx) -> Any:
    held = scheduler(ctx).stats.parked_entry(letter.key, letter.partition)
    return await command_on(ctx, KIND_UNPARK, letter, token, held=held, what="parked")


@router.delete(
    "/parked/{dlq_id:id}",
    response_model=CommandOut,
    summary="Delete a parked message: it is never redelivered, and a copy of its dead letter read later is dropped",
    description=(
        "Applied by the partition's handler through the inbox, as replays are. The deletion is recorded in the "
        "message's history with who asked; a parked head of an ordered key is skipped (the records held behind "
        "it go on)."
    ),
    responses=command_responses("Not parked"),
)
async def delete_parked(token: Acting, letter: CommandId, ctx: Ctx) -> Any:
    held = scheduler(ctx).stats.parked_entry(letter.key, letter.partition)
    return await command_on(ctx, KIND_DELETE_PARKED, letter, token, held=held, what="parked")


# -- parked groups -----------------------------------------------------------------------------------

EpochMs = Annotated[int | None, Query(ge=0, le=MAX_DUE_MS)]
GroupName = Annotated[str, Query(min_length=1, max_length=1024)]


def _group_filter(
    origin_topic: str | None, error_class: str | None, parked_from: int | None, parked_to: int | None
) -> GroupFilter:
    if parked_from is not None and parked_to is not None and parked_from > parked_to:
        raise Unprocessable(f"parked_from ({parked_from}) is after parked_to ({parked_to})")
    return GroupFilter(origin_topic, error_class, parked_from, parked_to)


async def _groups_of(svc: RetrySchedulerService, flt: GroupFilter, partitions: list[int]) -> dict[str, Any]:
    """The groups of these partitions, read a step at a time: the worker's other work (the
    handlers, other requests) runs between steps, however many messages are parked."""
    groups: dict[tuple[str, str], ParkedGroup] = {}
    complete = True
    for p in partitions:
        after: bytes | None = None
        for _ in range(GROUP_SCAN_BUDGET // GROUP_SCAN_STEP):
            scan = scan_parked_groups(svc.state.parked.view(p), flt, GROUP_SCAN_STEP, after)
            for g in scan.groups:
                _add_group(groups, g)
            after = scan.resume
            if after is None:
                break
            await asyncio.sleep(0)
        complete = complete and after is None
    return {"groups": [g.to_json() for g in groups.values()], "complete": complete}


def _add_group(groups: dict[tuple[str, str], ParkedGroup], g: ParkedGroup) -> None:
    mine = groups.get((g.origin_topic, g.error_class))
    if mine is None:
        groups[(g.origin_topic, g.error_class)] = g
    else:
        mine.merge(g)


def _merge_groups(pages: list[dict[str, Any]]) -> tuple[list[ParkedGroup], bool]:
    groups: dict[tuple[str, str], ParkedGroup] = {}
    for page in pages:
        for raw in page["groups"]:
            _add_group(groups, ParkedGroup.from_json(raw))
    ordered = sorted(groups.values(), key=lambda g: (-g.count, g.origin_topic, g.error_class))
    return ordered, all(page["complete"] for page in pages)


@router.get(
    "/parked-groups",
    response_model=ParkedGroupsOut,
    responses=LIST_ERRORS,
    dependencies=[READS_STATE],
    summary="Parked messages grouped by origin topic and error class: counts and the newest error",
)
async def parked_groups(
    request: Request,
    ctx: Ctx,
    origin_topic: OriginTopic = None,
    error_class: Annotated[str | None, Query(min_length=1, max_length=1024, description="Only this error class")] = None,
    parked_from: Annotated[int | None, Query(ge=0, le=MAX_DUE_MS, description="Only parked at or after (epoch ms)")] = None,
    parked_to: Annotated[int | None, Query(ge=0, le=MAX_DUE_MS, description="Only parked at or before (epoch ms)")] = None,
) -> Any:
    svc = scheduler(ctx)
    flt = _group_filter(origin_topic, error_class, parked_from, parked_to)

    async def local(partitions: list[int]) -> dict[str, Any]:
        return await _groups_of(svc, flt, partitions)

    if is_local_scope(request):
        # a peer's partial answer: not the public model
        return JSONResponse(await local(await local_scope_partitions(ctx, request, svc.state.schedule, svc.stats.owned())))
    groups, complete = _merge_groups(await gather(ctx, request, svc.state.schedule, local))
    return {"groups": [g.to_json() for g in groups], "total": sum(g.count for g in groups), "complete": complete}


@router.post(
    "/parked-groups/{action}",
    response_model=GroupActionOut,
    summary="Replay or cancel every parked message of a group (optionally parked within a time range); "
    "dry_run=true only counts them",
    description=(
        "Each partition's owner sends the command through the scheduler's inbox, so the partition's handler "
        "applies it in order with its other work, as single replays are. replay sends each message to its retry "
        "topic (dlq.attempt unchanged) and unparks it; cancel drops it. A partition acts on at most 500 messages "
        "per round and goes on by itself; the answer is the first round's."
    ),
    responses={**AUTH, **error_responses(422, 503, _503="An owner is recovering or rebalancing; retry")},
)
async def act_on_parked_group(
    token: Acting,
    request: Request,
    ctx: Ctx,
    action: Annotated[Literal["replay", "cancel"], Path(description="replay or cancel")],
    origin_topic: Annotated[str, Query(min_length=1, max_length=249, description="The group's origin topic")],
    error_class: GroupName,
    parked_from: Annotated[int | None, Query(ge=0, le=MAX_DUE_MS, description="Only parked at or after (epoch ms)")] = None,
    parked_to: Annotated[int | None, Query(ge=0, le=MAX_DUE_MS, description="Only parked at or before (epoch ms)")] = None,
    dry_run: Annotated[bool, Query(description="Only count what the action would cover; change nothing")] = False,
) -> Any:
    svc = scheduler(ctx)
    flt = _group_filter(origin_topic, error_class, parked_from, parked_to)
    allow(ctx, token, ACT, origin_topic)

    async def local(partitions: list[int]) -> dict[str, Any]:
        if dry_run:
            return await _groups_of(svc, flt, partitions)
        timeout = ctx.settings.forward_timeout_s
        return {
            "answers": list(
                await asyncio.gather(*(svc.commands.request_group(p, action, flt, timeout, token.name) for p in partitions))
            )
        }

    if is_local_scope(request):
        return JSONResponse(await local(owned_partitions_named(ctx, request, svc.stats.owned())))
    pages = await on_each_owner(ctx, request, svc.state.schedule, local)
    out: dict[str, Any] = {
        "action": action,
        "dry_run": dry_run,
        "origin_topic": origin_topic,
        "error_class": error_class,
        "parked_from": parked_from,
        "parked_to": parked_to,
    }
    if dry_run:
        groups, complete = _merge_groups(pages)
        return {**out, "matched": sum(g.count for g in groups), "complete": complete}
    answers = [a for page in pages for a in page["answers"]]
    done = [a for a in answers if a.get("status") == "done"]
    return {
        **out,
        "matched": sum(int(a["matched"]) for a in done),
        "done": sum(int(a["done"]) for a in done),
        "failed": sum(int(a["failed"]) for a in done),
        "continuing": any(a["more"] for a in done),
        "accepted_partitions": sorted(int(a["partition"]) for a in answers if a.get("status") != "done"),
    }
