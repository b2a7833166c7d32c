"""GET /instance: what this instance owns, how far behind its input is, and which peers it knows.

The operator console reads it from one instance of a service to find the others (the
``peers``), then from each of them; the answer is this instance's own view and is
never forwarded.

POST /instance/restarting is the peers' own: a worker stopping on SIGTERM tells each
peer it is restarting, so their peer watch does not remove its group member meanwhile
(see ``shared/engine/_membership.py``). So is POST /instance/rebalance: an instance whose
warm-up copies are caught up asks for the rebalance that hands them over, and has its peers
rejoin at once rather than at their next heartbeat (see ``shared/engine/_warmup.py``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from shared.http.deps import Admin, Ctx
from shared.http.errors import error_responses

router = APIRouter(tags=["health"])

#: Faust's own topic for electing the group leader: not an input anyone produces to.
_LEADER_TOPIC_SUFFIX = "__assignor-__leader"


class TopicLag(BaseModel):
    total: int | None = Field(description="Sum over the partitions; null while any is unknown")
    partitions: dict[str, int | None] = Field(description="Partition number -> records not yet committed")


class CopyOut(BaseModel):
    source: str = Field(description="active, standby or restoring (see X-Statefleet-Source)")
    lag: int | None = Field(description="Changelog records this copy has not applied (null: end not known yet)")


class InstanceOut(BaseModel):
    service: str
    instance: str = Field(description="STATEFLEET_INSTANCE_ID")
    url: str = Field(description="The URL peers forward queries to")
    ready: bool = Field(description="State restored; queries answered")
    rebalancing: bool
    active: dict[str, list[int]] = Field(description="Topic -> partitions this instance owns as active")
    standby: dict[str, list[int]] = Field(description="Changelog topic -> partitions kept here as standby copies")
    warmup: dict[str, list[int]] = Field(
        default_factory=dict,
        description="Changelog topic -> standby copies being warmed up to take the partition over once caught up "
        "(STATEFLEET_WARMUPS); a subset of standby",
    )
    lag: dict[str, TopicLag] = Field(
        description="Input topic -> records after the last processed batch: the high watermark minus the offset "
        "after that batch (before this assignment's first batch, minus the committed offset)"
    )
    copies: dict[str, dict[str, CopyOut]] = Field(
        default_factory=dict,
        description="Changelog topic -> partition -> this instance's copy of it (active, standby or restoring) and its lag",
    )
    peers: list[str] = Field(description="URLs of every instance of the service the last assignment named, this one included")
    unowned_inputs: list[str] = Field(
        default_factory=list,
        description="Input topics the group's last assignment gave no instance: none of their records is processed "
        "until the next assignment (the group's leader asks for one as soon as their metadata is known)",
    )


def _by_topic(tps: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for topic, partition in tps:
        out[topic].append(partition)
    return {topic: sorted(parts) for topic, parts in sorted(out.items())}


@router.get("/instance", response_model=InstanceOut, summary="This instance: partitions, input lag, peers")
async def instance(ctx: Ctx) -> Any:
    instance = ctx.instance
    changelogs = instance.changelog_topics()
    active, standby = instance.assigned()
    inputs = {(topic, p) for topic, p in active if topic not in changelogs and not topic.endswith(_LEADER_TOPIC_SUFFIX)}
    lag: dict[str, dict[str, Any]] = {}
    for (name, partition), behind in sorted(instance.input_lag(inputs).items()):
        topic = lag.setdefault(name, {"total": 0, "partitions": {}})
        topic["partitions"][str(partition)] = behind
        topic["total"] = None if behind is None or topic["total"] is None else topic["total"] + behind
    copies = {
        topic: {str(p): {"source": copy.source, "lag": copy.lag} for p, copy in sorted(parts.items())}
        for topic, parts in sorted((await instance.copies()).items())
    }
    return {
        "copies": copies,
        "service": ctx.service,
        "instance": ctx.settings.instance_id,
        "url": ctx.url,
        "ready": ctx.ready(),
        "rebalancing": instance.rebalancing,
        "active": _by_topic(active),
        "standby": _by_topic(standby),
        "warmup": instance.warmups(),
        "lag": lag,
        "peers": sorted(instance.peer_urls() | {ctx.url}),
        "unowned_inputs": sorted(instance.unowned_inputs()),
    }


class RestartingIn(BaseModel):
    url: str = Field(min_length=1, max_length=2048, description="The restarting instance's URL (as its peers know it)")


class RestartingOut(BaseModel):
    url: str
    noted: bool = Field(description="False when this instance keeps no peer watch (STATEFLEET_PEER_WATCH=false)")
    grace_s: float = Field(description="How long its group member is left alone unless it is back (the restart grace)")


@router.post(
    "/instance/restarting",
    response_model=RestartingOut,
    dependencies=[Admin],
    responses=error_responses(401, 422),
    summary="A peer is restarting: do not remove its group member meanwhile (sent by the peers themselves)",
)
async def restarting(body: RestartingIn, ctx: Ctx) -> Any:
    noted = ctx.instance.note_peer_restarting(body.url)
    return {"url": body.url, "noted": noted, "grace_s": ctx.settings.effective_restart_grace_s}


class RebalanceIn(BaseModel):
    url: str = Field(min_length=1, max_length=2048, description="The URL of the instance asking (as its peers know it)")


class RebalanceOut(BaseModel):
    url: str
    rejoining: bool = Field(
        description="False, and nothing done, when the URL is not another member of the group's last assignment "
        "or this instance's consumer has not started"
    )


@router.post(
    "/instance/rebalance",
    response_model=RebalanceOut,
    dependencies=[Admin],
    responses=error_responses(401, 422),
    summary="A peer's warm-up copies are caught up: rejoin the group now, so the rebalance that hands them over "
    "is short (sent by the peers themselves)",
)
async def rebalance(body: RebalanceIn, ctx: Ctx) -> Any:
    return {"url": body.url, "rejoining": ctx.instance.rejoin_for_peer(body.url)}
