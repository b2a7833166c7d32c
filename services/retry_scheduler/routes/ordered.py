"""HTTP: ordered retries' blocked keys (GET /ordered-keys/blocked lists them, GET /ordered-keys
reads one, and the operator's commands on one: replay its parked head, skip its head, park the
whole key), from any instance.

A key is named by its origin topic and its original key (UTF-8 text); the instance that owns
the lane's inbox partition answers, and commands are applied by that partition's handler,
in order with the lane's letters and acknowledgements. The list is gathered from every
partition, as GET /parked is.
"""

from __future__ import annotations

from base64 import b64decode, b64encode
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from services.retry_scheduler.handlers.ordered import LANE_ACTIONS, LaneAction
from services.retry_scheduler.models import key_text
from services.retry_scheduler.routes.auth import ACT, Acting, allow
from services.retry_scheduler.routes.common import AUTH, BUSY, COMMAND_BUSY, LIST_ERRORS, SCAN_BUDGET, Cursor, Limit, scheduler
from services.retry_scheduler.routes.pages import cursor_after, merge_pages
from services.retry_scheduler.scans import scan_lanes
from services.retry_scheduler.state import LANE_PREFIX, decode_lane, lane_row_key
from shared.engine import Table, partition_for
from shared.http.context import ServiceContext
from shared.http.deps import Ctx, owned_key
from shared.http.errors import Conflict, NotFound, Unavailable, error_responses
from shared.http.forwarding import READS_STATE, gather, is_local_scope, local_scope_partitions
from shared.http.pagination import InvalidCursor, decode_cursor, encode_cursor
from shared.ordered_retries import lane_key, split_lane_key

router = APIRouter(tags=["ordered retries"])

#: Held ids a GET lists (the first ones, in the order they will be released).
HELD_LISTED = 100
#: Names GET /ordered-keys/blocked in its cursors.
BLOCKED = "ordered-keys"

OrderedTopic = Annotated[str, Query(min_length=1, max_length=249, description="The origin topic (an ordered one)")]
OriginalKey = Annotated[str, Query(min_length=1, max_length=4096, description="The original key, as UTF-8 text")]


async def _lane_name(origin_topic: OrderedTopic, key: OriginalKey) -> str:
    """The lane as text (its key's base64), the form a route's owned key takes."""
    return b64encode(lane_key(origin_topic, key.encode())).decode()


def _partition_of_lane(ctx: ServiceContext, lane_name: str) -> int:
    return partition_for(b64decode(lane_name), ctx.settings.topic_partitions)


def _index(ctx: ServiceContext) -> Table:
    return scheduler(ctx).state.index


ReadLane = Annotated[str, owned_key(_lane_name, _index, _partition_of_lane)]
CommandLane = Annotated[str, owned_key(_lane_name, _index, _partition_of_lane, reads=False)]


class LaneOut(BaseModel):
    head: str = Field(description="dlq.id of the dead letter the key's later records wait behind")
    head_status: str = Field(description="scheduled, parked, or away (redelivered, not acknowledged yet)")
    held: int = Field(description="Records held behind the head")
    held_ids: list[str] = Field(description=f"dlq.id of the first {HELD_LISTED} held records, in release order")


class LaneCommandOut(BaseModel):
    status: str = Field(description="redelivered, skipped, parked, or accepted (applied asynchronously)")
    head: str | None = Field(None, description="The head acted on; after skip-head, the new head (null: the key is free)")
    skipped: str | None = None
    parked: int | None = Field(None, description="park-key: records parked (in this first round)")
    continuing: bool | None = Field(None, description="park-key: more held records than one round parks; the rest follow")


class BlockedKeyOut(BaseModel):
    origin_topic: str
    key: str | None = Field(
        description="The original key as UTF-8 text; null when it is not valid UTF-8 (GET /ordered-keys and its "
        "commands take the key as text, so such a key cannot be named there: key_base64 shows its bytes)"
    )
    key_base64: str = Field(description="The original key's bytes, base64")
    head: str = Field(description="dlq.id of the dead letter the key's later records wait behind")
    head_status: str = Field(description="scheduled, parked, or away (redelivered, not acknowledged yet)")
    held: int = Field(description="Records held behind the head")


class BlockedKeysPage(BaseModel):
    items: list[BlockedKeyOut] = Field(description="By origin topic, then by the key's bytes")
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last page")

    model_config = {
        "json_schema_extra": {
            "examples": [
                {
                    "items": [
                        {
                            "origin_topic": "orders",
                            "key": "customer-7",
                            "key_base64": "Y3VzdG9tZXItNw==",
                            "head": "orders-3-1187",
                            "head_status": "parked",
                            "held": 12,
                        }
                    ],
                    "next_cursor": None,
                }
            ]
        }
    }


def blocked_sort(item: dict[str, Any]) -> bytes:
    """A listed key's place in the list: its lane key (origin topic, NUL, the key's bytes)."""
    return lane_key(str(item["origin_topic"]), b64decode(item["key_base64"]))


def blocked_cursor(lane: bytes) -> str:
    return encode_cursor(lane.hex(), BLOCKED)


def decode_blocked_cursor(cursor: str | None) -> bytes | None:
    """The lane a GET /ordered-keys/blocked cursor resumes after (exclusive); ``None`` without one."""
    text = decode_cursor(cursor, BLOCKED)
    if text is None:
        return None
    try:
        return bytes.fromhex(text)
    except ValueError as exc:
        raise InvalidCursor("cursor is not one this API returned") from exc


def blocked_key_json(lane: bytes, raw_lane_row: bytes, head_status: str) -> dict[str, Any]:
    """One blocked key as GET /ordered-keys/blocked lists it."""
    origin_topic, key = split_lane_key(lane)
    row = decode_lane(raw_lane_row)
    return {
        "origin_topic": origin_topic,
        "key": key_text(key),
        "key_base64": b64encode(key).decode(),
        "head": row.head,
        "head_status": head_status,
        "held": row.held,
    }


@router.get(
    "/ordered-keys/blocked",
    response_model=BlockedKeysPage,
    summary="Blocked keys of ordered topics: each key's head, its status and how many records it holds",
    description=(
        "Gathered from every partition and instance, as GET /parked is. A key that is not valid UTF-8 is listed "
        "with key null and its bytes in key_base64."
    ),
    responses=LIST_ERRORS,
    dependencies=[READS_STATE],
)
async def list_blocked_keys(
    request: Request,
    ctx: Ctx,
    limit: Limit = 100,
    origin_topic: Annotated[
        str | None, Query(min_length=1, max_length=249, description="Only keys of this origin topic (as the letters name it)")
    ] = None,
    cursor: Cursor = None,
) -> Any:
    svc = scheduler(ctx)
    after_lane = decode_blocked_cursor(cursor)
    after = lane_row_key(after_lane) if after_lane is not None else None

    async def local(partitions: list[int]) -> dict[str, Any]:
        pages: list[dict[str, Any]] = []
        for p in partitions:
            scan = scan_lanes(svc.state.index.view(p), after=after, limit=limit, origin_topic=origin_topic, budget=SCAN_BUDGET)
            items = []
            for key, raw in scan.items:
                lane = key[len(LANE_PREFIX) :]
                items.append(blocked_key_json(lane, raw, svc.stats.head_status(p, decode_lane(raw).head)))
            frontier = scan.frontier[len(LANE_PREFIX) :].hex() if scan.frontier is not None else None
            pages.append({"items": items, "frontier": frontier})
        items, frontier = merge_pages(pages, limit, blocked_sort, bytes.fromhex)
        return {"items": items, "frontier": frontier.hex() if frontier is not None else None}

    if is_local_scope(request):
        # a peer's partial answer: not the public model
        return JSONResponse(await local(await local_scope_partitions(ctx, request, svc.state.index, svc.stats.owned())))
    pages = await gather(ctx, request, svc.state.index, local)
    items, frontier = merge_pages(pages, limit, blocked_sort, bytes.fromhex)
    return {"items": items, "next_cursor": cursor_after(items, limit, frontier, blocked_sort, blocked_cursor)}


@router.get(
    "/ordered-keys",
    response_model=LaneOut,
    summary="A blocked key of an ordered topic: its head and held records",
    responses={**BUSY, **error_responses(404, _404="The key is not blocked")},
)
async def get_lane(lane: ReadLane, ctx: Ctx) -> Any:
    view = scheduler(ctx).stats.lane_view(b64decode(lane), HELD_LISTED)
    if view is None:
        raise NotFound("the key is not blocked")
    return view


async def act_on_lane(action: LaneAction, token: Acting, origin_topic: str, lane: CommandLane, ctx: Ctx) -> Any:
    allow(ctx, token, ACT, origin_topic)
    result = await scheduler(ctx).commands.request_lane(b64decode(lane), action, ctx.settings.forward_timeout_s, actor=token.name)
    status = result.get("status")
    if status == "not_found":
        raise NotFound("the key is not blocked")
    if status == "parking":
        raise Conflict("the key is being parked")
    if status == "not_parked":
        raise Conflict(f"the head {result.get('head')!r} is {result.get('head_status')}, not parked")
    if status == "failed":
        raise Unavailable(f"the redelivery of the head failed, it stays parked: {result.get('detail')}")
    if status == "accepted":
        return JSONResponse(result, status_code=202)
    return result


def _lane_command(action: LaneAction) -> Callable[..., Awaitable[Any]]:
    async def command(token: Acting, origin_topic: OrderedTopic, lane: CommandLane, ctx: Ctx) -> Any:
        return await act_on_lane(action, token, origin_topic, lane, ctx)

    command.__name__ = f"{action.replace('-', '_')}_of_lane"
    return command


# One route per action, not POST /ordered-keys/{action}: a path parameter there would also take
# /ordered-keys/blocked, whose POST must answer 405 (only GET is allowed), not 422.
for _action in LANE_ACTIONS:
    router.add_api_route(
        f"/ordered-keys/{_action}",
        _lane_command(_action),  # type: ignore[arg-type]
        methods=["POST"],
        response_model=LaneCommandOut,
        summary={
            "replay-head": "Replay a blocked key's parked head",
            "skip-head": "Skip a blocked key's head, releasing the next record",
            "park-key": "Park a blocked key whole: its head and every record it holds",
        }[_action],
        responses={
            202: {"model": LaneCommandOut, "description": "Accepted; applied shortly"},
            **AUTH,
            **error_responses(
                404, 409, 422, _404="The key is not blocked", _409="The head is not parked, or the key is being parked"
            ),
            **COMMAND_BUSY,
        },
    )
