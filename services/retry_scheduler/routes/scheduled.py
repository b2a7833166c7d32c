"""HTTP: scheduled messages (GET /retries, /retries/stats, /retries/{id}, /scheduled/{id}; replay and
cancel), from any instance."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

import shared.http.paths  # noqa: F401  (registers the {name:id} path convertor)
from services.retry_scheduler.domain import MAX_DUE_MS, percentile
from services.retry_scheduler.entries import Entry, decode_entry
from services.retry_scheduler.handlers.kinds import KIND_CANCEL, KIND_REPLAY
from services.retry_scheduler.models import CommandOut, RetryOut, RetryPage, StatsOut, entry_json
from services.retry_scheduler.routes.auth import OPTIONAL_BEARER, READ, Acting, Listing, Reading, allow, listed_entry
from services.retry_scheduler.routes.common import (
    BUSY,
    LIST_AUTH,
    LIST_ERRORS,
    READ_AUTH,
    SCAN_BUDGET,
    CommandId,
    Cursor,
    Limit,
    OriginTopic,
    ReadId,
    Responses,
    command_on,
    command_responses,
    scheduler,
)
from services.retry_scheduler.routes.pages import (
    cursor_after,
    decode_retry_cursor,
    merge_pages,
    retry_cursor,
    retry_frontier,
    retry_sort,
)
from services.retry_scheduler.scans import PageScan, scan_page
from services.retry_scheduler.state import Done, split_due_key
from shared.http.deps import Ctx
from shared.http.errors import NotFound, error_responses
from shared.http.forwarding import READS_STATE, gather, gather_owners, is_local_scope, local_scope_partitions
from shared.ordered_retries import HELD_BEHIND, header

router = APIRouter(tags=["retries"])


@router.get(
    "/retries/stats",
    response_model=StatsOut,
    summary="Counts, oldest due time, lateness",
    responses=BUSY,
    dependencies=[READS_STATE],
)
async def retry_stats(request: Request, ctx: Ctx) -> Any:
    svc = scheduler(ctx)

    async def local() -> dict[str, Any]:
        owned = svc.stats.owned()
        svc.stats.update_gauges()
        lanes = svc.stats.lane_counts(owned)
        return {
            **svc.state.counts.totals(owned),
            "blocked_keys": lanes.blocked_keys,
            "held": lanes.held,
            "oldest_due_at": svc.stats.oldest_due(owned),
            "redelivered_total": svc.state.totals["redelivered"],
            "parked_total": svc.state.totals["parked"],
            "lateness_samples": list(svc.state.lateness_ms),
            "last_ticks": [t.to_json() for p, t in sorted(svc.ticks.last_ticks.items()) if p in owned],
            "busy_ticks": [t.to_json() for t in svc.ticks.busy_ticks],
            "policy": svc.routing.policies.to_json(),
        }

    if is_local_scope(request):
        return JSONResponse(await local())  # a peer's partial answer: not the public model
    pages = await gather_owners(ctx, request, svc.state.schedule, local)
    out: dict[str, Any] = {
        "scheduled": 0,
        "parked": 0,
        "blocked_keys": 0,
        "held": 0,
        "by_origin_topic": {},
        "by_error_class": {},
        "parked_by_origin_topic": {},
        "oldest_due_at": None,
        "redelivered_total": 0,
        "parked_total": 0,
        "last_ticks": [],
        "busy_ticks": [],
        "instances": len(pages),
        "policy": pages[0]["policy"] if pages else svc.routing.policies.to_json(),
    }
    samples: list[int] = []
    for page in pages:
        for name in ("scheduled", "parked", "redelivered_total", "parked_total"):
            out[name] += int(page[name])
        for name in ("blocked_keys", "held"):  # absent from an instance of an earlier version
            out[name] += int(page.get(name, 0))
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
        "count": len(samples),
        "p50_ms": percentile(samples, 50),
        "p99_ms": percentile(samples, 99),
        "max_ms": samples[-1] if samples else None,
    }
    out["last_ticks"].sort(key=lambda t: t["partition"])
    out["busy_ticks"].sort(key=lambda t: (t["at"], t["partition"]))
    return out


@router.get(
    "/retries",
    response_model=RetryPage,
    summary="Scheduled messages in due order",
    description="With STATEFLEET_PAYLOADS_REQUIRE_TOKEN, the key and headers of a message whose origin topic the "
    "call's token does not cover with read are left out (payload_hidden).",
    responses={**LIST_ERRORS, **LIST_AUTH},
    dependencies=[READS_STATE],
    openapi_extra=OPTIONAL_BEARER,
)
async def list_retries(
    token: Listing,
    request: Request,
    ctx: Ctx,
    limit: Limit = 100,
    due_before: Annotated[int | None, Query(ge=0, le=MAX_DUE_MS, description="Only due before this (epoch ms)")] = None,
    origin_topic: OriginTopic = None,
    cursor: Cursor = None,
) -> Any:
    svc = scheduler(ctx)
    after = decode_retry_cursor(cursor)

    async def local(partitions: list[int]) -> dict[str, Any]:
        pages: list[dict[str, Any]] = []
        for p in partitions:
            scan: PageScan = scan_page(
                svc.state.schedule.view(p),
                after=after,
                limit=limit,
                due_before=due_before,
                origin_topic=origin_topic,
                budget=SCAN_BUDGET,
                start=svc.state.low_water.get(p, b""),
            )
            pages.append(
                {
                    "items": [listed_entry(ctx, token, decode_entry(raw)) for _, raw in scan.items],
                    "frontier": list(split_due_key(scan.frontier)) if scan.frontier is not None else None,
                }
            )
        items, frontier = merge_pages(pages, limit, retry_sort, retry_frontier)
        return {"items": items, "frontier": list(frontier) if frontier is not None else None}

    if is_local_scope(request):
        # a peer's partial answer: not the public model
        return JSONResponse(await local(await local_scope_partitions(ctx, request, svc.state.schedule, svc.stats.owned())))
    pages = await gather(ctx, request, svc.state.schedule, local)
    items, frontier = merge_pages(pages, limit, retry_sort, retry_frontier)
    next_cursor = cursor_after(items, limit, frontier, retry_sort, lambda key: retry_cursor(*key))
    return {"items": items, "next_cursor": next_cursor}


_GET_RETRY: Responses = {
    **error_responses(404, 422, 503, _404="Not scheduled (never seen, redelivered, cancelled or parked)"),
    **READ_AUTH,
}


# GET /retries/stats comes first, so the id "stats" cannot be asked for as /retries/stats:
# /scheduled/{id} has no literal path beside it and answers for every id.
@router.get(
    "/retries/{dlq_id:id}",
    response_model=RetryOut,
    summary="One scheduled message",
    responses=_GET_RETRY,
    openapi_extra=OPTIONAL_BEARER,
)
@router.get(
    "/scheduled/{dlq_id:id}",
    response_model=RetryOut,
    responses=_GET_RETRY,
    summary='One scheduled message, any id (GET /retries/stats answers the stats, this the id "stats")',
    openapi_extra=OPTIONAL_BEARER,
)
async def get_retry(token: Reading, letter: ReadId, ctx: Ctx) -> Any:
    svc = scheduler(ctx)
    dlq_id, partition = letter.key, letter.partition
    state = svc.stats.index_entry(dlq_id, partition)
    if isinstance(state, Entry):
        if token is not None:
            allow(ctx, token, READ, state.origin_topic)
        return entry_json(state, with_value=True)
    held = svc.stats.held_entry(dlq_id, partition)
    if held is not None:
        head = (header(held.headers, HELD_BEHIND) or b"").decode(errors="replace")
        hint = f" (ordered retries: it waits behind {head!r}, the head of its key; GET /ordered-keys?origin_topic=&key=)"
    elif svc.stats.parked_entry(dlq_id, partition) is not None:
        hint = " (it is parked: GET /parked/{id})"
    elif isinstance(state, Done):
        hint = f" (attempt {state.attempt} was {state.what})"
    else:
        hint = ""
    raise NotFound(f"no scheduled message with dlq.id {dlq_id!r}{hint}")


@router.post(
    "/retries/{dlq_id:id}/replay",
    response_model=CommandOut,
    summary="Redeliver a scheduled message now",
    responses=command_responses("Not scheduled"),
)
async def replay_retry(token: Acting, letter: CommandId, ctx: Ctx) -> Any:
    held = scheduler(ctx).stats.scheduled_entry(letter.key, letter.partition)
    return await command_on(ctx, KIND_REPLAY, letter, token, held=held, what="scheduled")


@router.delete(
    "/retries/{dlq_id:id}",
    response_model=CommandOut,
    summary="Cancel a scheduled message (it is not redelivered)",
    responses=command_responses("Not scheduled"),
)
async def cancel_retry(token: Acting, letter: CommandId, ctx: Ctx) -> Any:
    held = scheduler(ctx).stats.scheduled_entry(letter.key, letter.partition)
    return await command_on(ctx, KIND_CANCEL, letter, token, held=held, what="scheduled")
