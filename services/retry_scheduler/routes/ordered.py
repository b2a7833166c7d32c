"""HTTP: ordered retries' blocked keys (GET /ordered-keys, and the operator's commands on one:
replay its parked head, skip its head, park the whole key), from any instance.

A key is named by its origin topic and its original key (UTF-8 text); the instance that owns
the lane's inbox partition answers, and commands are applied by that partition's handler,
in order with the lane's letters and acknowledgements.
"""

from __future__ import annotations

from base64 import b64decode, b64encode
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from services.retry_scheduler.handlers.ordered import LaneAction
from services.retry_scheduler.routes.common import AUTH, BUSY, COMMAND_BUSY, service_of
from shared.engine import Table, partition_for
from shared.http.context import ServiceContext
from shared.http.deps import Admin, Ctx, owned_key
from shared.http.errors import Conflict, NotFound, Unavailable, error_responses
from shared.ordered_retries import lane_key

router = APIRouter(tags=["ordered retries"])

#: Held ids a GET lists (the first ones, in the order they will be released).
HELD_LISTED = 100

OrderedTopic = Annotated[str, Query(min_length=1, max_length=249, description="The origin topic (an ordered one)")]
OriginalKey = Annotated[str, Query(min_length=1, max_length=4096, description="The original key, as UTF-8 text")]
LaneActionPath = Annotated[LaneAction, Path(description="What to do with the key")]


async def _lane_name(origin_topic: OrderedTopic, key: OriginalKey) -> str:
    """The lane as text (its key's base64), the form a route's owned key takes."""
    return b64encode(lane_key(origin_topic, key.encode())).decode()


def _partition_of_lane(ctx: ServiceContext, lane_name: str) -> int:
    return partition_for(b64decode(lane_name), ctx.settings.topic_partitions)


def _index(ctx: ServiceContext) -> Table:
    return service_of(ctx).state.index


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


@router.get(
    "/ordered-keys",
    response_model=LaneOut,
    summary="A blocked key of an ordered topic: its head and held records",
    responses={**BUSY, **error_responses(404, _404="The key is not blocked")},
)
async def get_lane(lane: ReadLane, ctx: Ctx) -> Any:
    view = service_of(ctx).stats.lane_view(b64decode(lane), HELD_LISTED)
    if view is None:
        raise NotFound("the key is not blocked")
    return view


@router.post(
    "/ordered-keys/{action}",
    response_model=LaneCommandOut,
    dependencies=[Admin],
    summary="Replay a blocked key's parked head, skip its head (releasing the next), or park the whole key",
    responses={
        202: {"model": LaneCommandOut, "description": "Accepted; applied shortly"},
        **AUTH,
        **error_responses(
            404, 409, 422, _404="The key is not blocked", _409="The head is not parked, or the key is being parked"
        ),
        **COMMAND_BUSY,
    },
)
async def act_on_lane(action: LaneActionPath, lane: CommandLane, ctx: Ctx) -> Any:
    result = await service_of(ctx).commands.request_lane(b64decode(lane), action, ctx.settings.forward_timeout_s)
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
