"""HTTP: scheduled and parked messages, from any instance.

Point queries and commands go to the instance that owns the id's partition (the id
says which: the scheduler keys everything by ``dlq.id``); lists and stats are gathered
from every instance. Commands (replay, cancel, replay a parked message) need the admin
bearer token and are applied by the partition's agent, in order with its other work;
the answer comes once the agent has applied them. A group action (every parked message of
an origin topic and error class) is applied by each instance to the partitions it owns,
through the same inbox, and the answers are summed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse

import shared.http.paths  # noqa: F401  (registers the {name:id} path convertor)
from services.retry_scheduler.app import KIND_CANCEL, KIND_REPLAY, KIND_UNPARK, RetrySchedulerService
from services.retry_scheduler.domain import MAX_DUE_MS, percentile
from services.retry_scheduler.models import (
    CommandOut,
    GroupActionOut,
    ParkedGroupsOut,
    ParkedOut,
    ParkedPage,
    RetryOut,
    RetryPage,
    StatsOut,
    entry_json,
)
from services.retry_scheduler.state import (
    Done,
    Entry,
    GroupFilter,
    PageScan,
    ParkedGroup,
    decode_entry,
    due_key,
    id_key,
    id_of,
    scan_ids,
    scan_page,
    scan_parked_groups,
    split_due_key,
)
from shared.engine import partition_db
from shared.http.deps import Admin, Ctx
from shared.http.errors import NotFound, Unavailable, Unprocessable, error_responses
from shared.http.forwarding import (
    READS_STATE,
    gather,
    gather_owners,
    is_local_scope,
    local_scope_partitions,
    on_each_owner,
    owned_partitions_named,
    route,
)
from shared.http.pagination import CursorParam, InvalidCursor, decode_cursor, encode_cursor

router = APIRouter(tags=["retries"])

#: Most entries one partition examines for one list request (filters can skip many).
SCAN_BUDGET = 50_000
MAX_ID_LENGTH = 1024
#: Most parked rows one partition examines to group them or count a group (beyond: counts are lower bounds),
#: in steps of GROUP_SCAN_STEP rows.
GROUP_SCAN_BUDGET = 1_000_000
GROUP_SCAN_STEP = 10_000
#: Names GET /parked in its cursors.
PARKED = "parked"

DlqId = Annotated[str, Path(min_length=1, max_length=MAX_ID_LENGTH, description="dlq.id")]
Limit = Annotated[int, Query(ge=1, le=1000)]
Cursor = CursorParam
OriginTopic = Annotated[str | None, Query(min_length=1, max_length=249, description="Only messages from this topic")]

Responses = dict[int | str, dict[str, Any]]
_AUTH: Responses = error_responses(401)
_BUSY: Responses = error_responses(503)
_LIST: Responses = error_responses(400, 422, 503, _400="A cursor this API did not make")
_ACCEPTED: Responses = {202: {"model": CommandOut, "description": "Accepted; applied shortly"}}
_COMMAND_BUSY: Responses = error_responses(
    503, _503="Owner recovering or rebalancing, or the redelivery failed (the message is kept); retry",
)


def _service(ctx: Any) -> RetrySchedulerService:
    svc: RetrySchedulerService = ctx.extras["service"]
    return svc


# -- merging pages -----------------------------------------------------------------------------------


def _merge(
    pages: list[dict[str, Any]], limit: int, sort_key: Any, frontier_key: Any,
) -> tuple[list[dict[str, Any]], Any]:
    """The first ``limit`` items of all pages in order, none past the lowest frontier.

    A page's frontier says it stopped early (its scan budget ran out) having examined
    everything up to there; items of other pages beyond it must wait for the next page.
    """
    frontiers = [frontier_key(p["frontier"]) for p in pages if p.get("frontier") is not None]
    frontier = min(frontiers) if frontiers else None
    seen: dict[Any, dict[str, Any]] = {}
    for page in pages:
        for item in page.get("items", []):
            k = sort_key(item)
            if frontier is None or k <= frontier:
                seen.setdefault(k, item)
    items = [seen[k] for k in sorted(seen)[:limit]]
    return items, frontier


def _next_cursor(
    items: list[dict[str, Any]], limit: int, frontier: Any, sort_key: Any, encode: Callable[[Any], str],
) -> str | None:
    """After a full page, resume past its last item; after a short one, at the frontier."""
    if len(items) == limit:
        return encode(sort_key(items[-1]))
    return encode(frontier) if frontier is not None else None


def _retry_sort(item: dict[str, Any]) -> tuple[int, str]:
    return int(item["due_at"]), str(item["id"])


def _retry_frontier(f: Any) -> tuple[int, str]:
    return int(f[0]), str(f[1])


def _parked_sort(item: dict[str, Any]) -> str:
    return str(item["id"])


def _retry_cursor(due_at: int, dlq_id: str) -> str:
    return encode_cursor(f"{due_at}:{dlq_id}", "retries")


def _decode_retry_cursor(cursor: str | None) -> bytes | None:
    text = decode_cursor(cursor, "retries")
    if text is None:
        return None
    due, sep, dlq_id = text.partition(":")
    if not sep or not due.isdigit() or int(due) > MAX_DUE_MS:
        raise InvalidCursor("cursor is not one this API returned")
    return due_key(int(due), dlq_id)


# -- scheduled ---------------------------------------------------------------------------------------


@router.get(
    "/retries/stats", response_model=StatsOut, summary="Counts, oldest due time, lateness", responses=_BUSY,
    dependencies=[READS_STATE],
)
async def retry_stats(request: Request, ctx: Ctx) -> Any:
    svc = _service(ctx)

    async def local() -> dict[str, Any]:
        owned = svc.owned()
        svc.update_gauges()
        return {
            **svc.counts.totals(owned),
            "oldest_due_at": svc.oldest_due(owned),
            "redelivered_total": svc.totals["redelivered"],
            "parked_total": svc.totals["parked"],
            "lateness_samples": list(svc.lateness_ms),
            "last_ticks": [t.to_json() for p, t in sorted(svc.last_ticks.items()) if p in owned],
            "busy_ticks": [t.to_json() for t in svc.busy_ticks],
            "policy": svc.policies.to_json(),
        }

    if is_local_scope(request):
        return JSONResponse(await local())  # a peer's partial answer: not the public model
    pages = await gather_owners(ctx, request, svc.schedule, local)
    out: dict[str, Any] = {
        "scheduled": 0, "parked": 0, "by_origin_topic": {}, "by_error_class": {}, "parked_by_origin_topic": {},
        "oldest_due_at": None, "redelivered_total": 0, "parked_total": 0, "last_ticks": [], "busy_ticks": [],
        "instances": len(pages), "policy": pages[0]["policy"] if pages else svc.policies.to_json(),
    }
    samples: list[int] = []
    for page in pages:
        for name in ("scheduled", "parked", "redelivered_total", "parked_total"):
            out[name] += int(page[name])
        for name in ("by_origin_topic", "by_error_class", "parked_by_origin_topic"):
            for k, v in page[name].items():
                out[name][k] = out[name].get(k, 0) + int(v)
        if page["oldest_due_at"] is not None:
            oldest = out["oldest_due_at"]
            out["oldest_due_at"] = page["oldest_due_at"] if oldest is None else min(oldest, page["oldest_due_at"])
        samples.extend(int(s) for s in page["lateness_samples"])
        out["last_ticks"].extend(page["last_ticks"])
        out["busy_ticks"].extend(page["busy_ticks"])
    samples.sort()
    out["lateness"] = {
        "count": len(samples), "p50_ms": percentile(samples, 50), "p99_ms": percentile(samples, 99),
        "max_ms": samples[-1] if samples else None,
    }
    out["last_ticks"].sort(key=lambda t: t["partition"])
    out["busy_ticks"].sort(key=lambda t: (t["at"], t["partition"]))
    return out


@router.get(
    "/retries", response_model=RetryPage, summary="Scheduled messages in due order", responses=_LIST,
    dependencies=[READS_STATE],
)
async def list_retries(
    request: Request,
    ctx: Ctx,
    limit: Limit = 100,
    due_before: Annotated[int | None, Query(ge=0, le=MAX_DUE_MS, description="Only due before this (epoch ms)")] = None,
    origin_topic: OriginTopic = None,
    cursor: Cursor = None,
) -> Any:
    svc = _service(ctx)
    after = _decode_retry_cursor(cursor)

    async def local(partitions: list[int]) -> dict[str, Any]:
        pages: list[dict[str, Any]] = []
        for p in partitions:
            scan: PageScan = scan_page(
                partition_db(svc.schedule, p), after=after, limit=limit, due_before=due_before,
                origin_topic=origin_topic, budget=SCAN_BUDGET, start=svc.low_water.get(p, b""),
            )
            pages.append({
                "items": [entry_json(decode_entry(raw)) for _, raw in scan.items],
                "frontier": list(split_due_key(scan.frontier)) if scan.frontier is not None else None,
            })
        items, frontier = _merge(pages, limit, _retry_sort, _retry_frontier)
        return {"items": items, "frontier": list(frontier) if frontier is not None else None}

    if is_local_scope(request):
        # a peer's partial answer: not the public model
        return JSONResponse(await local(await local_scope_partitions(ctx, request, svc.schedule, svc.owned())))
    pages = await gather(ctx, request, svc.schedule, local)
    items, frontier = _merge(pages, limit, _retry_sort, _retry_frontier)
    next_cursor = _next_cursor(items, limit, frontier, _retry_sort, lambda key: _retry_cursor(*key))
    return {"items": items, "next_cursor": next_cursor}


_GET_RETRY: Responses = error_responses(
    404, 422, 503, _404="Not scheduled (never seen, redelivered, cancelled or parked)",
)


# GET /retries/stats comes first, so the id "stats" cannot be asked for as /retries/stats:
# /scheduled/{id} has no literal path beside it and answers for every id.
@router.get(
    "/retries/{dlq_id:id}", response_model=RetryOut, summary="One scheduled message", responses=_GET_RETRY,
    dependencies=[READS_STATE],
)
@router.get(
    "/scheduled/{dlq_id:id}", response_model=RetryOut, responses=_GET_RETRY, dependencies=[READS_STATE],
    summary="One scheduled message, any id (GET /retries/stats answers the stats, this the id \"stats\")",
)
async def get_retry(dlq_id: DlqId, request: Request, ctx: Ctx) -> Any:
    svc = _service(ctx)
    forwarded = await route(ctx, request, svc.schedule, svc.partition_of(dlq_id))
    if forwarded is not None:
        return forwarded
    state = svc.index_entry(dlq_id)
    if isinstance(state, Entry):
        return entry_json(state, with_value=True)
    if svc.parked_entry(dlq_id) is not None:
        hint = " (it is parked: GET /parked/{id})"
    elif isinstance(state, Done):
        hint = f" (attempt {state.attempt} was {state.what})"
    else:
        hint = ""
    raise NotFound(f"no scheduled message with dlq.id {dlq_id!r}{hint}")


def _command_answer(result: dict[str, Any]) -> Any:
    status = result.get("status")
    if status == "not_found":
        raise NotFound(f"no such message with dlq.id {result['id']!r}")
    if status == "failed":
        raise Unavailable(f"redelivery failed, the message is kept: {result.get('detail')}")
    if status == "accepted":
        return JSONResponse(result, status_code=202)
    return result


@router.post(
    "/retries/{dlq_id:id}/replay", response_model=CommandOut, dependencies=[Admin],
    summary="Redeliver a scheduled message now",
    responses={**_ACCEPTED, **_AUTH, **error_responses(404, 422, _404="Not scheduled"), **_COMMAND_BUSY},
)
async def replay_retry(dlq_id: DlqId, request: Request, ctx: Ctx) -> Any:
    svc = _service(ctx)
    forwarded = await route(ctx, request, svc.schedule, svc.partition_of(dlq_id))
    if forwarded is not None:
        return forwarded
    if svc.scheduled_entry(dlq_id) is None:
        raise NotFound(f"no scheduled message with dlq.id {dlq_id!r}")
    return _command_answer(await svc.request(KIND_REPLAY, dlq_id, ctx.settings.forward_timeout_s))


@router.delete(
    "/retries/{dlq_id:id}", response_model=CommandOut, dependencies=[Admin],
    summary="Cancel a scheduled message (it is not redelivered)",
    responses={**_ACCEPTED, **_AUTH, **error_responses(404, 422, _404="Not scheduled"), **_COMMAND_BUSY},
)
async def cancel_retry(dlq_id: DlqId, request: Request, ctx: Ctx) -> Any:
    svc = _service(ctx)
    forwarded = await route(ctx, request, svc.schedule, svc.partition_of(dlq_id))
    if forwarded is not None:
        return forwarded
    if svc.scheduled_entry(dlq_id) is None:
        raise NotFound(f"no scheduled message with dlq.id {dlq_id!r}")
    return _command_answer(await svc.request(KIND_CANCEL, dlq_id, ctx.settings.forward_timeout_s))


# -- parked ------------------------------------------------------------------------------------------


@router.get(
    "/parked", response_model=ParkedPage, summary="Parked messages, ordered by dlq.id", responses=_LIST,
    dependencies=[READS_STATE],
)
async def list_parked(
    request: Request,
    ctx: Ctx,
    limit: Limit = 100,
    origin_topic: OriginTopic = None,
    cursor: Cursor = None,
) -> Any:
    svc = _service(ctx)
    after_id = decode_cursor(cursor, PARKED)
    after = id_key(after_id) if after_id is not None else None

    async def local(partitions: list[int]) -> dict[str, Any]:
        pages: list[dict[str, Any]] = []
        for p in partitions:
            scan = scan_ids(
                partition_db(svc.parked, p), after=after, limit=limit, origin_topic=origin_topic, budget=SCAN_BUDGET,
            )
            pages.append({
                "items": [entry_json(decode_entry(raw)) for _, raw in scan.items],
                "frontier": id_of(scan.frontier) if scan.frontier is not None else None,
            })
        items, frontier = _merge(pages, limit, _parked_sort, str)
        return {"items": items, "frontier": frontier}

    if is_local_scope(request):
        # a peer's partial answer: not the public model
        return JSONResponse(await local(await local_scope_partitions(ctx, request, svc.schedule, svc.owned())))
    pages = await gather(ctx, request, svc.schedule, local)
    items, frontier = _merge(pages, limit, _parked_sort, str)
    next_cursor = _next_cursor(items, limit, frontier, _parked_sort, lambda key: encode_cursor(key, PARKED))
    return {"items": items, "next_cursor": next_cursor}


@router.get(
    "/parked/{dlq_id:id}", response_model=ParkedOut, summary="One parked message", dependencies=[READS_STATE],
    responses=error_responses(404, 422, 503, _404="Not parked"),
)
async def get_parked(dlq_id: DlqId, request: Request, ctx: Ctx) -> Any:
    svc = _service(ctx)
    forwarded = await route(ctx, request, svc.schedule, svc.partition_of(dlq_id))
    if forwarded is not None:
        return forwarded
    entry = svc.parked_entry(dlq_id)
    if entry is None:
        raise NotFound(f"no parked message with dlq.id {dlq_id!r}")
    return entry_json(entry, with_value=True)


@router.post(
    "/parked/{dlq_id:id}/replay", response_model=CommandOut, dependencies=[Admin],
    summary="Redeliver a parked message to its retry topic (dlq.attempt unchanged) and unpark it",
    responses={**_ACCEPTED, **_AUTH, **error_responses(404, 422, _404="Not parked"), **_COMMAND_BUSY},
)
async def replay_parked(dlq_id: DlqId, request: Request, ctx: Ctx) -> Any:
    svc = _service(ctx)
    forwarded = await route(ctx, request, svc.schedule, svc.partition_of(dlq_id))
    if forwarded is not None:
        return forwarded
    if svc.parked_entry(dlq_id) is None:
        raise NotFound(f"no parked message with dlq.id {dlq_id!r}")
    return _command_answer(await svc.request(KIND_UNPARK, dlq_id, ctx.settings.forward_timeout_s))


# -- parked groups -----------------------------------------------------------------------------------

EpochMs = Annotated[int | None, Query(ge=0, le=MAX_DUE_MS)]
GroupName = Annotated[str, Query(min_length=1, max_length=1024)]


def _group_filter(
    origin_topic: str | None, error_class: str | None, parked_from: int | None, parked_to: int | None,
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
            scan = scan_parked_groups(partition_db(svc.parked, p), flt, GROUP_SCAN_STEP, after)
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
    "/parked-groups", response_model=ParkedGroupsOut, responses=_LIST, dependencies=[READS_STATE],
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
    svc = _service(ctx)
    flt = _group_filter(origin_topic, error_class, parked_from, parked_to)

    async def local(partitions: list[int]) -> dict[str, Any]:
        return await _groups_of(svc, flt, partitions)

    if is_local_scope(request):
        # a peer's partial answer: not the public model
        return JSONResponse(await local(await local_scope_partitions(ctx, request, svc.schedule, svc.owned())))
    groups, complete = _merge_groups(await gather(ctx, request, svc.schedule, local))
    return {"groups": [g.to_json() for g in groups], "total": sum(g.count for g in groups), "complete": complete}


@router.post(
    "/parked-groups/{action}", response_model=GroupActionOut, dependencies=[Admin],
    summary="Replay or cancel every parked message of a group (optionally parked within a time range); "
            "dry_run=true only counts them",
    description=(
        "Each partition's owner sends the command through the scheduler's inbox, so the partition's handler "
        "applies it in order with its other work, as single replays are. replay sends each message to its retry "
        "topic (dlq.attempt unchanged) and unparks it; cancel drops it. A partition acts on at most 500 messages "
        "per round and goes on by itself; the answer is the first round's."
    ),
    responses={**_AUTH, **error_responses(422, 503, _503="An owner is recovering or rebalancing; retry")},
)
async def act_on_parked_group(
    request: Request,
    ctx: Ctx,
    action: Annotated[Literal["replay", "cancel"], Path(description="replay or cancel")],
    origin_topic: Annotated[str, Query(min_length=1, max_length=249, description="The group's origin topic")],
    error_class: GroupName,
    parked_from: Annotated[int | None, Query(ge=0, le=MAX_DUE_MS, description="Only parked at or after (epoch ms)")] = None,
    parked_to: Annotated[int | None, Query(ge=0, le=MAX_DUE_MS, description="Only parked at or before (epoch ms)")] = None,
    dry_run: Annotated[bool, Query(description="Only count what the action would cover; change nothing")] = False,
) -> Any:
    svc = _service(ctx)
    flt = _group_filter(origin_topic, error_class, parked_from, parked_to)

    async def local(partitions: list[int]) -> dict[str, Any]:
        if dry_run:
            return await _groups_of(svc, flt, partitions)
        timeout = ctx.settings.forward_timeout_s
        return {"answers": list(await asyncio.gather(*(svc.request_group(p, action, flt, timeout) for p in partitions)))}

    if is_local_scope(request):
        return JSONResponse(await local(owned_partitions_named(ctx, request, svc.owned())))
    pages = await on_each_owner(ctx, request, svc.schedule, local)
    out: dict[str, Any] = {
        "action": action, "dry_run": dry_run, "origin_topic": origin_topic, "error_class": error_class,
        "parked_from": parked_from, "parked_to": parked_to,
    }
    if dry_run:
        groups, complete = _merge_groups(pages)
        return {**out, "matched": sum(g.count for g in groups), "complete": complete}
    answers = [a for page in pages for a in page["answers"]]
    done = [a for a in answers if a.get("status") == "done"]
    return {
        **out,
        "matched": sum(int(a["matched"]) for a in done), "done": sum(int(a["done"]) for a in done),
        "failed": sum(int(a["failed"]) for a in done), "continuing": any(a["more"] for a in done),
        "accepted_partitions": sorted(int(a["partition"]) for a in answers if a.get("status") != "done"),
    }
