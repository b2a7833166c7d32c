"""Answer any key from any instance.

A point query is served where the key's partition is active; elsewhere it is
forwarded to that instance with its method, query and body, and the owner's status
and body come back unchanged. A list query is gathered from every owning instance
and merged by the caller. Forwarded requests carry ``X-Statefleet-Forwarded-By``; an
instance that receives one for a key it does not own answers 503 instead of
forwarding again, so ownership that moves during a rebalance cannot make a loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import httpx
from fastapi import Request, Response

from shared.codecs import loads
from shared.engine import AnyTable, partition_owner_url
from shared.http.context import ServiceContext
from shared.http.errors import Unavailable
from shared.metrics import HTTP_FORWARDED

log = logging.getLogger(__name__)

FORWARDED_BY = "X-Statefleet-Forwarded-By"
SERVED_BY = "X-Statefleet-Served-By"
LOCAL_SCOPE_PARAM = "scope"
HOP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade"}


def owner_of(ctx: ServiceContext, table: AnyTable, partition: int) -> str:
    """The URL of the instance that owns ``partition``, or 503 when nobody is known to."""
    if ctx.app.rebalancing:
        raise Unavailable("the consumer group is rebalancing; retry shortly")
    owner = partition_owner_url(ctx.app, table, partition)
    if owner is None:
        raise Unavailable(f"no instance owns partition {partition} yet; retry shortly")
    return owner


async def route(ctx: ServiceContext, request: Request, table: AnyTable, partition: int) -> Response | None:
    """``None`` when this instance should answer; otherwise the owner's response."""
    owner = owner_of(ctx, table, partition)
    if owner == ctx.url:
        if not ctx.ready():
            raise Unavailable("state is being restored; retry shortly")
        return None
    if request.headers.get(FORWARDED_BY):
        raise Unavailable(f"partition {partition} moved while the request was forwarded; retry shortly")
    return await forward(ctx, request, owner)


def raw_path(request: Request) -> str:
    """The path as the client sent it, still percent-encoded.

    Ids may hold ``/``, ``%``, ``?`` or ``#``: the decoded path would forward
    ``/tallies/a%3Fb`` as ``/tallies/a?b``, a different resource with a query.
    """
    raw = request.scope.get("raw_path")
    if isinstance(raw, bytes) and raw:
        return raw.decode("latin-1")
    return quote(request.url.path, safe="/")


async def forward(ctx: ServiceContext, request: Request, owner: str) -> Response:
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
    headers[FORWARDED_BY] = ctx.url
    body = await request.body()
    url = owner + raw_path(request)
    HTTP_FORWARDED.labels(ctx.service).inc()
    try:
        resp = await ctx.http.request(request.method, url, params=request.query_params, content=body, headers=headers)
    except httpx.HTTPError as exc:
        log.warning("forwarding %s %s to %s failed: %s", request.method, request.url.path, owner, exc)
        raise Unavailable(f"the owning instance {owner} did not answer; retry shortly") from exc
    out_headers = {k.lower(): v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS | {"content-encoding"}}
    out_headers.setdefault(SERVED_BY.lower(), owner)
    return Response(content=resp.content, status_code=resp.status_code, headers=out_headers)


def is_local_scope(request: Request) -> bool:
    return request.query_params.get(LOCAL_SCOPE_PARAM) == "local"


async def gather(
    ctx: ServiceContext,
    request: Request,
    table: AnyTable,
    local: Callable[[], Awaitable[Any]],
) -> list[Any]:
    """The local answer of every instance that owns partitions of ``table``.

    Each peer is asked the same path and query with ``scope=local``; this instance
    calls ``local`` directly. 503 while any partition has no known owner, so a list
    is never silently missing a partition.
    """
    if ctx.app.rebalancing:
        raise Unavailable("the consumer group is rebalancing; retry shortly")
    owners: set[str] = set()
    for p in range(ctx.settings.topic_partitions):
        owners.add(owner_of(ctx, table, p))
    if ctx.url in owners and not ctx.ready():
        raise Unavailable("state is being restored; retry shortly")

    async def ask(owner: str) -> Any:
        if owner == ctx.url:
            return await local()
        params = dict(request.query_params)
        params[LOCAL_SCOPE_PARAM] = "local"
        try:
            resp = await ctx.http.get(owner + raw_path(request), params=params, headers={FORWARDED_BY: ctx.url})
        except httpx.HTTPError as exc:
            raise Unavailable(f"instance {owner} did not answer; retry shortly") from exc
        if resp.status_code != 200:
            raise Unavailable(f"instance {owner} answered {resp.status_code}; retry shortly")
        return loads(resp.content)

    return list(await asyncio.gather(*(ask(o) for o in sorted(owners))))
