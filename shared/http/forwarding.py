"""Answer any key from any instance, and never wait for one instance to do it.

A read is answered where the key's partition is active; elsewhere it is forwarded to
that instance with its method, query and body, and the owner's status, headers and body
come back unchanged. When the owner cannot answer — dead, restarting, stalled,
rebalancing, restoring — the read is answered from the freshest copy of the partition
that any instance holds: this instance's own (a standby, a restoring copy, or the
database of a partition it owned before) or a peer's, asked with
``X-Statefleet-Read-Copy``. Every answer read from state says where it came from and how
far behind it may be (``X-Statefleet-Source``, ``X-Statefleet-Lag-Records``), and
``?max_lag=N`` refuses a copy more than N changelog records behind (503 with
``Retry-After`` and the lag in the body). See docs/contract.md, "Availability".

Changes (anything but GET and HEAD) go to the active owner only, never to a copy.

A route for one key declares it with ``shared.http.deps.owned_key``, which runs :func:`route`
before the route's body (raising :class:`AnsweredElsewhere` with another instance's answer).
A key that may be in any of several partitions (``shared.http.deps.located_key``) is asked of
each in turn, forwarded with ``X-Statefleet-Partition`` naming the one asked about.

A list is gathered from every instance that owns partitions of the table and merged by
the caller. Forwarded requests carry ``X-Statefleet-Forwarded-By``; an instance that
receives one for a key it does not own answers from its own copy instead of forwarding
again, so ownership that moves during a rebalance cannot make a loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar
from urllib.parse import quote

import httpx
from fastapi import Depends, Query, Request, Response

from shared.codecs import loads
from shared.engine import Copy, Table
from shared.http.context import ServiceContext
from shared.http.errors import Unavailable, Unprocessable
from shared.metrics import (
    HTTP_FORWARDED,
    LIST_PARTITION_ORPHANED,
    NO_OWNER,
    OWNER_DID_NOT_ANSWER,
    OWNER_SUSPECTED,
    OWNER_UNAVAILABLE,
    READ_FAILOVERS,
    READ_LAG,
    READS_SERVED,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

FORWARDED_BY = "X-Statefleet-Forwarded-By"
SERVED_BY = "X-Statefleet-Served-By"
SOURCE = "X-Statefleet-Source"
LAG = "X-Statefleet-Lag-Records"
#: Sent to a peer: answer from your own copy of the partition, do not forward.
READ_COPY = "X-Statefleet-Read-Copy"
#: The one partition a forwarded request asks about, for a key whose partition the key alone
#: does not tell (see ``shared.http.deps.located_key``).
PARTITION_ASKED = "X-Statefleet-Partition"
MAX_LAG_PARAM = "max_lag"
LOCAL_SCOPE_PARAM = "scope"
HOP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade"}
READ_METHODS = ("GET", "HEAD")
#: Headers of a peer's answer not passed on: hop-by-hop ones, and those this server sets itself.
_NOT_PASSED_ON = HOP_HEADERS | {"content-encoding", "date", "server"}

#: Connecting to a peer takes a millisecond on a working network; longer means it is gone
#: (a dead pod's address gives connection timeouts, not refusals).
CONNECT_TIMEOUT_S = 0.5
#: Pause between two looks for an instance that can answer a read.
READ_RETRY_INTERVAL_S = 0.1
#: Retry-After of a refused read: a copy catches up, or an owner comes back, within seconds.
RETRY_AFTER_S = 1


async def max_lag_param(
    max_lag: Annotated[
        int | None,
        Query(
            ge=0,
            description=(
                "Refuse an answer from a copy more than this many changelog records behind "
                "(503 with Retry-After and the lag); 0 accepts only an up-to-date copy"
            ),
        ),
    ] = None,
) -> int | None:
    return max_lag


#: In the ``dependencies`` of every endpoint that reads state but not one key's (a key's read
#: takes ``max_lag`` through ``shared.http.deps.owned_key``): /openapi.json then documents
#: ``max_lag`` and the answer's source headers there (see ``shared.http.api``).
READS_STATE = Depends(max_lag_param)


@dataclass(frozen=True, slots=True)
class ReadFrom:
    """Where an answer read from state came from (set on ``request.state.read_from``)."""

    source: str
    lag: int | None


class StaleCopy(Unavailable):
    """Every copy that could answer is further behind than ``?max_lag`` allows."""

    def __init__(self, lag: int | None, max_lag: int, source: str | None = None) -> None:
        behind = "an unknown number of" if lag is None else str(lag)
        super().__init__(
            f"the freshest copy that could answer is {behind} changelog records behind, more than max_lag={max_lag}; "
            "retry shortly",
            retry_after=RETRY_AFTER_S,
        )
        self.extra = {"lag": lag, "max_lag": max_lag}
        if source is not None:
            self.headers[SOURCE] = source
        if lag is not None:
            self.headers[LAG] = str(lag)


class NoCopy(Unavailable):
    """Neither the owner nor any copy of the partition could answer."""


def requested_max_lag(request: Request) -> int | None:
    raw = request.query_params.get(MAX_LAG_PARAM)
    if raw is None or raw == "":
        return None
    if not raw.isdigit():
        raise Unprocessable(f"{MAX_LAG_PARAM} must be a whole number of records, 0 or more; got {raw!r}")
    return int(raw)


class AnsweredElsewhere(Exception):
    """Another instance answered the request; its answer is the response, as it gave it."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


async def answer_here(ctx: ServiceContext, request: Request, table: Table, partition: int) -> None:
    """Return when this instance answers ``request`` (see :func:`route`); otherwise raise
    :class:`AnsweredElsewhere` with the answer of the instance that should."""
    answer = await route(ctx, request, table, partition)
    if answer is not None:
        raise AnsweredElsewhere(answer)


def owner_of(ctx: ServiceContext, table: Table, partition: int) -> str:
    """The URL of the instance that owns ``partition``, or 503 when nobody is known to."""
    if ctx.instance.rebalancing:
        raise Unavailable("the consumer group is rebalancing; retry shortly")
    owner = table.owner_url(partition)
    if owner is None:
        raise Unavailable(f"no instance owns partition {partition} yet; retry shortly")
    return owner


async def route(ctx: ServiceContext, request: Request, table: Table, partition: int) -> Response | None:
    """``None`` when this instance should answer (from its own copy, for reads); otherwise the
    answer of the instance that should."""
    if request.method not in READ_METHODS:
        return await _route_change(ctx, request, table, partition)
    max_lag = requested_max_lag(request)
    if request.headers.get(READ_COPY):
        copy = await table.copy(partition)
        if copy is None:
            raise Unavailable(f"no copy of partition {partition} here", retry_after=RETRY_AFTER_S)
        return _deliver(ctx, request, copy, max_lag)
    # Only the instance the client asked waits for a better answer (a peer's forwarded request
    # answers at once, so waits do not add up): around a restart or a rebalance, ownership
    # moves and copies catch up within about a second, and an answer from a copy that is
    # behind is given only when nothing fresher turned up by then.
    patient = not request.headers.get(FORWARDED_BY)
    found = await _until_settled(
        ctx.settings.read_retry_s if patient else 0.0,
        lambda: _freshest_answer(ctx, request, table, partition),
        settled=lambda found: found.lag == 0,
        retry_on=NoCopy,
    )
    return _deliver(ctx, request, found.answer, max_lag)


async def _until_settled(
    budget_s: float, attempt: Callable[[], Awaitable[T]], *, settled: Callable[[T], bool], retry_on: type[Exception]
) -> T:
    """``attempt()`` again every :data:`READ_RETRY_INTERVAL_S` while it raises ``retry_on`` or its
    answer is not ``settled``, for up to ``budget_s``; then its last answer (or error) stands."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + budget_s
    while True:
        try:
            answer = await attempt()
        except retry_on:
            if loop.time() >= deadline:
                raise
        else:
            if settled(answer) or loop.time() >= deadline:
                return answer
        await asyncio.sleep(READ_RETRY_INTERVAL_S)


@dataclass(frozen=True, slots=True)
class _Found:
    """An answer a read could be given: from this instance's copy, or a peer's response."""

    lag: int | None
    answer: Copy | Response


def _deliver(ctx: ServiceContext, request: Request, answer: Copy | Response, max_lag: int | None) -> Response | None:
    if isinstance(answer, Response):
        return answer  # the instance that answered applied max_lag itself
    _answer_from(ctx, request, ReadFrom(answer.source, answer.lag), max_lag)
    return None


def _answer_from(ctx: ServiceContext, request: Request, read_from: ReadFrom, max_lag: int | None) -> None:
    """This instance answers from state as fresh as ``read_from`` says, unless ``max_lag`` refuses it."""
    if max_lag is not None and (read_from.lag is None or read_from.lag > max_lag):
        raise StaleCopy(read_from.lag, max_lag, read_from.source)
    request.state.read_from = read_from
    READS_SERVED.labels(ctx.service, read_from.source).inc()
    if read_from.lag is not None:
        READ_LAG.labels(ctx.service).observe(read_from.lag)


async def _freshest_answer(ctx: ServiceContext, request: Request, table: Table, partition: int) -> _Found:
    """The active owner's answer, or else the answer of the copy with the smallest lag."""
    owner = None if ctx.instance.rebalancing else table.owner_url(partition)
    gone: set[str] = set()  # instances that did not answer at all: not asked again this round
    if owner == ctx.url:
        copy = await table.copy(partition)
        if copy is not None and copy.source == "active":
            return _Found(0, copy)
    elif owner is not None and not request.headers.get(FORWARDED_BY) and not ctx.suspected(owner):
        try:
            resp = await forward(ctx, request, owner, limits=_owner_timeout(ctx))
        except OwnerDidNotAnswer as exc:
            ctx.suspect(owner)
            gone.add(owner)
            READ_FAILOVERS.labels(ctx.service, OWNER_DID_NOT_ANSWER).inc()
            log.info("%s; answering %s from a copy", exc, request.url.path)
        else:
            if resp.status_code != 503:
                return _Found(_lag_header(resp) or 0, resp)
            # Rebalancing or restoring: it may still hold the freshest copy, asked for below.
            READ_FAILOVERS.labels(ctx.service, OWNER_UNAVAILABLE).inc()
    else:
        READ_FAILOVERS.labels(ctx.service, NO_OWNER if owner is None else OWNER_SUSPECTED).inc()
    mine = await table.copy(partition)
    if mine is not None and mine.lag == 0:
        return _Found(0, mine)
    peers = _peers(ctx, table) - gone - {ctx.url}
    answers = await _ask_peers_for_copies(ctx, request, peers)
    candidates: list[_Found] = [_Found(lag, resp) for lag, resp in answers if resp.status_code != 503]
    if mine is not None:
        candidates.insert(0, _Found(mine.lag, mine))  # on a tie, this instance's own copy
    if candidates:
        return min(candidates, key=lambda found: _lag_order(found.lag))
    stale = [lag for lag, resp in answers if resp.status_code == 503 and lag is not None]
    max_lag = requested_max_lag(request)
    if max_lag is not None and stale:
        raise StaleCopy(min(stale), max_lag)
    asked = ", ".join(f"{resp.headers.get(SERVED_BY, '?')} answered {resp.status_code}" for _, resp in answers)
    raise NoCopy(
        f"no instance that answered holds a copy of partition {partition} (its owner is away; "
        f"asked {len(peers)} other instances{': ' + asked if asked else ''}); retry shortly",
        retry_after=RETRY_AFTER_S,
    )


async def _route_change(ctx: ServiceContext, request: Request, table: Table, partition: int) -> Response | None:
    owner = owner_of(ctx, table, partition)
    if owner == ctx.url:
        if not ctx.ready():
            raise Unavailable("state is being restored; retry shortly")
        return None
    if request.headers.get(FORWARDED_BY):
        raise Unavailable(f"partition {partition} moved while the request was forwarded; retry shortly")
    try:
        return await forward(ctx, request, owner)
    except OwnerDidNotAnswer as exc:
        raise Unavailable(f"{exc}; retry shortly") from exc


def _owner_timeout(ctx: ServiceContext) -> httpx.Timeout:
    return httpx.Timeout(ctx.settings.owner_read_timeout_s, connect=min(CONNECT_TIMEOUT_S, ctx.settings.owner_read_timeout_s))


def _lag_header(resp: httpx.Response | Response) -> int | None:
    lag = resp.headers.get(LAG)
    return int(lag) if lag is not None and lag.isdigit() else None


def _lag_order(lag: int | None) -> float:
    return float("inf") if lag is None else float(lag)


def _peers(ctx: ServiceContext, table: Table) -> set[str]:
    """Every instance the last assignment named, and every owner of a partition of ``table``."""
    return ctx.instance.peer_urls() | table.owner_urls()


async def _ask_peers_for_copies(ctx: ServiceContext, request: Request, peers: set[str]) -> list[tuple[int | None, Response]]:
    """Each answering peer's answer from its own copy, with the lag it reported; as soon as one
    answers from an up-to-date copy, that answer alone.

    Peers suspected of being away are asked too: this is the last resort, and a peer that has
    just come back (a rolling restart) may hold the only copy.
    """
    if not peers:
        return []
    headers = _forward_headers(ctx, request)
    headers[READ_COPY] = "1"
    body = await request.body()

    async def ask(peer: str) -> tuple[int | None, Response] | None:
        try:
            resp = await ctx.http.request(
                request.method,
                peer + raw_path(request),
                params=request.query_params,
                content=body,
                headers=headers,
                timeout=_owner_timeout(ctx),
            )
        except httpx.HTTPError as exc:
            log.info("asking %s for its copy of %s failed: %r", peer, request.url.path, exc)
            ctx.suspect(peer)
            return None
        return _lag_header(resp), _response_of(resp, peer)

    tasks = [asyncio.ensure_future(ask(peer)) for peer in sorted(peers)]
    answers: list[tuple[int | None, Response]] = []
    try:
        for next_answer in asyncio.as_completed(tasks):
            answer = await next_answer
            if answer is None:
                continue
            if answer[0] == 0 and answer[1].status_code != 503:
                return [answer]
            answers.append(answer)
    finally:
        for task in tasks:
            task.cancel()
    return answers


def raw_path(request: Request) -> str:
    """The path as the client sent it, still percent-encoded.

    Ids may hold ``/``, ``%``, ``?`` or ``#``: the decoded path would forward
    ``/tallies/a%3Fb`` as ``/tallies/a?b``, a different resource with a query.
    """
    raw = request.scope.get("raw_path")
    if isinstance(raw, bytes) and raw:
        return raw.decode("latin-1")
    return quote(request.url.path, safe="/")


class OwnerDidNotAnswer(Exception):
    """The owning instance could not be reached or did not answer in time."""


def ask_about_partition(request: Request, partition: int) -> None:
    """Forward ``request`` from now on as a question about ``partition`` alone."""
    request.state.partition_asked = partition


def _forward_headers(ctx: ServiceContext, request: Request) -> dict[str, str]:
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS | {PARTITION_ASKED.lower()}}
    headers[FORWARDED_BY] = ctx.url
    asked = getattr(request.state, "partition_asked", None)
    if asked is not None:
        headers[PARTITION_ASKED] = str(asked)
    return headers


def _response_of(resp: httpx.Response, served_by: str) -> Response:
    out_headers = {k.lower(): v for k, v in resp.headers.items() if k.lower() not in _NOT_PASSED_ON}
    out_headers.setdefault(SERVED_BY.lower(), served_by)
    return Response(content=resp.content, status_code=resp.status_code, headers=out_headers)


async def forward(ctx: ServiceContext, request: Request, owner: str, *, limits: httpx.Timeout | None = None) -> Response:
    """The owner's answer to ``request``, as it gave it (:class:`OwnerDidNotAnswer` if none came)."""
    body = await request.body()
    url = owner + raw_path(request)
    HTTP_FORWARDED.labels(ctx.service).inc()
    kwargs: dict[str, Any] = {} if limits is None else {"timeout": limits}
    try:
        resp = await ctx.http.request(
            request.method, url, params=request.query_params, content=body, headers=_forward_headers(ctx, request), **kwargs
        )
    except httpx.HTTPError as exc:
        log.warning("forwarding %s %s to %s failed: %r", request.method, request.url.path, owner, exc)
        raise OwnerDidNotAnswer(f"the owning instance {owner} did not answer") from exc
    return _response_of(resp, owner)


def is_local_scope(request: Request) -> bool:
    return request.query_params.get(LOCAL_SCOPE_PARAM) == "local"


PartitionsPage = Callable[[list[int]], Awaitable[Any]]

#: With ``scope=local``: the partitions a peer asks this instance to list (default: those it owns).
PARTITIONS_PARAM = "partitions"
_SOURCE_RANK = {"active": 0, "standby": 1, "restoring": 2}


async def local_scope_partitions(ctx: ServiceContext, request: Request, table: Table, owned: set[int]) -> list[int]:
    """The partitions a ``scope=local`` request asks this instance to list: the ``partitions``
    it names, or else those it owns. A copy read (``X-Statefleet-Read-Copy``) is answered only
    when this instance holds a copy of every partition named, and says how far behind they are.

    Any other request asks this instance as the partitions' active owner, whose answer the asker
    takes as up to date (no source headers): 503 unless it is one now, that is it owns every
    partition named and has restored them since the last rebalance. An instance that was
    removed from the group and rejoined is named the owner by its peers as soon as the
    rebalance assigns the partitions, while it still holds the state it had before: answering
    from it then would list stale figures as current. The asker then lists those partitions
    from the freshest copy, as it does for an owner that does not answer."""
    raw = request.query_params.get(PARTITIONS_PARAM)
    try:
        partitions = sorted({int(p) for p in raw.split(",")}) if raw else sorted(owned)
    except ValueError as exc:
        raise Unprocessable(f"{PARTITIONS_PARAM} must be comma-separated partition numbers") from exc
    if request.headers.get(READ_COPY):
        copies = [await table.copy(p) for p in partitions]
        if any(copy is None for copy in copies):
            raise Unavailable("no copy of some of those partitions here", retry_after=RETRY_AFTER_S)
        held = [copy for copy in copies if copy is not None]
        request.state.read_from = _worst(held)
        return partitions
    moved = [p for p in partitions if p not in owned]
    if moved or ctx.instance.rebalancing or not ctx.ready():
        raise Unavailable(
            f"partitions {moved or partitions} are not active and restored here; retry shortly", retry_after=RETRY_AFTER_S
        )
    return partitions


def _worst(copies: Iterable[Copy | ReadFrom]) -> ReadFrom:
    source, lag = "active", 0
    for copy in copies:
        if _SOURCE_RANK.get(copy.source, 2) > _SOURCE_RANK[source]:
            source = copy.source
        lag = -1 if lag == -1 or copy.lag is None else max(lag, copy.lag)
    return ReadFrom(source, None if lag == -1 else lag)


async def gather(ctx: ServiceContext, request: Request, table: Table, local: PartitionsPage) -> list[Any]:
    """One local page per instance that answers for some partitions of ``table``: from each
    partition's owner, or, where the owner cannot answer, from the freshest copy of it (as a
    point read does). The answer's source headers give the least fresh copy that contributed.

    Peers are asked the same path and query with ``scope=local`` and the ``partitions`` they
    should list. While some partition has no instance that can answer, or a copy used is
    behind, it asks again for up to ``read_retry_s``; then the freshest answer found stands, or
    503: a list is never silently missing a partition.
    """
    max_lag = requested_max_lag(request)
    pages, read_from = await _until_settled(
        ctx.settings.read_retry_s,
        lambda: _gather_partitions(ctx, request, table, local),
        settled=lambda gathered: gathered[1].lag == 0,
        retry_on=NoCopy,
    )
    _answer_from(ctx, request, read_from, max_lag)
    return pages


async def _gather_partitions(
    ctx: ServiceContext, request: Request, table: Table, local: PartitionsPage
) -> tuple[list[Any], ReadFrom]:
    by_owner: dict[str | None, list[int]] = {}
    for p in range(table.partitions):
        owner = None if ctx.instance.rebalancing else table.owner_url(p)
        by_owner.setdefault(owner, []).append(p)
    pages: list[Any] = []
    sources: list[ReadFrom] = []
    orphans = list(by_owner.pop(None, []))

    async def ask(url: str, partitions: list[int], *, copy: bool) -> tuple[Any, ReadFrom] | None:
        params = dict(request.query_params)
        params[LOCAL_SCOPE_PARAM] = "local"
        params[PARTITIONS_PARAM] = ",".join(map(str, partitions))
        headers = {FORWARDED_BY: ctx.url, **({READ_COPY: "1"} if copy else {})}
        if "authorization" in request.headers:  # a list may show each caller only what its token covers
            headers["Authorization"] = request.headers["authorization"]
        try:
            resp = await ctx.http.get(url + raw_path(request), params=params, headers=headers, timeout=_owner_timeout(ctx))
        except httpx.HTTPError:
            ctx.suspect(url)
            return None
        if resp.status_code != 200:
            return None
        if SOURCE not in resp.headers:  # the owner answered from the partitions it processes
            return loads(resp.content), ReadFrom("active", 0)
        return loads(resp.content), ReadFrom(resp.headers[SOURCE], _lag_header(resp))

    mine = by_owner.pop(ctx.url, [])
    if mine:
        if ctx.ready() and not ctx.instance.rebalancing:
            pages.append(await local(mine))
            sources.append(ReadFrom("active", 0))
        else:
            orphans.extend(mine)
    remote = {owner: parts for owner, parts in by_owner.items() if owner is not None and not ctx.suspected(owner)}
    orphans.extend(p for owner, parts in by_owner.items() if owner not in remote for p in parts)
    owners = sorted(remote)
    for owner, answer in zip(owners, await asyncio.gather(*(ask(o, remote[o], copy=False) for o in owners)), strict=True):
        if answer is None:
            orphans.extend(remote[owner])
        else:
            pages.append(answer[0])
            sources.append(answer[1])
    if orphans:
        READ_FAILOVERS.labels(ctx.service, LIST_PARTITION_ORPHANED).inc(len(orphans))
    peers = _peers(ctx, table) - {ctx.url}
    for p in sorted(orphans):
        candidates: list[tuple[ReadFrom, Any]] = []
        copy = await table.copy(p)
        if copy is not None:
            candidates.append((ReadFrom(copy.source, copy.lag), None))
        if copy is None or copy.lag != 0:
            answers = await asyncio.gather(*(ask(peer, [p], copy=True) for peer in sorted(peers)))
            candidates += [(read_from, page) for page, read_from in (a for a in answers if a is not None)]
        if not candidates:
            raise NoCopy(f"no instance that answered holds a copy of partition {p}; retry shortly", retry_after=RETRY_AFTER_S)
        read_from, page = min(candidates, key=lambda c: _lag_order(c[0].lag))
        pages.append(await local([p]) if page is None else page)
        sources.append(read_from)
    return pages, _worst(sources)


async def gather_owners(ctx: ServiceContext, request: Request, table: Table, local: Callable[[], Awaitable[Any]]) -> list[Any]:
    """The local answer of every instance that owns partitions of ``table``, for answers that
    only owners can give (figures kept in memory by the owner, such as the retry scheduler's
    stats).

    Each peer is asked the same path and query with ``scope=local``; this instance
    calls ``local`` directly. While any partition has no known owner, or an owner does
    not answer, it asks again for up to ``read_retry_s`` (around a restart or a
    rebalance ownership settles within about a second), then answers 503: a list is
    never silently missing a partition.
    """
    pages = await _until_settled(
        ctx.settings.read_retry_s, lambda: _gather_once(ctx, request, table, local), settled=lambda _: True, retry_on=Unavailable
    )
    _answer_from(ctx, request, ReadFrom("active", 0), None)
    return pages


async def _gather_once(ctx: ServiceContext, request: Request, table: Table, local: Callable[[], Awaitable[Any]]) -> list[Any]:
    if ctx.instance.rebalancing:
        raise Unavailable("the consumer group is rebalancing; retry shortly")
    owners: set[str] = set()
    for p in range(table.partitions):
        owners.add(owner_of(ctx, table, p))
    if ctx.url in owners and not ctx.ready():
        raise Unavailable("state is being restored; retry shortly")

    async def ask(owner: str) -> Any:
        if owner == ctx.url:
            return await local()
        params = dict(request.query_params)
        params[LOCAL_SCOPE_PARAM] = "local"
        return await _owner_part(
            ctx, owner, ctx.http.get(owner + raw_path(request), params=params, headers={FORWARDED_BY: ctx.url})
        )

    return list(await asyncio.gather(*(ask(o) for o in sorted(owners))))


async def _owner_part(ctx: ServiceContext, owner: str, call: Awaitable[httpx.Response]) -> Any:
    """An owner's part of an answer gathered from every owner: its 200 body, or else 503."""
    try:
        resp = await call
    except httpx.HTTPError as exc:
        ctx.suspect(owner)
        raise Unavailable(f"instance {owner} did not answer; retry shortly") from exc
    if resp.status_code != 200:
        raise Unavailable(f"instance {owner} answered {resp.status_code}; retry shortly")
    return loads(resp.content)


async def on_each_owner(ctx: ServiceContext, request: Request, table: Table, local: PartitionsPage) -> list[Any]:
    """A change that spans every partition of ``table``: each active owner applies it to the
    partitions it owns, and answers with its part.

    Peers get the same method, path, query and body, with ``scope=local`` and the
    ``partitions`` to act on (see :func:`owned_partitions_named`); this instance calls
    ``local`` with its own. Changes never go to a copy: 503 when a partition has no owner,
    an owner is restoring, or an owner does not answer 200.
    """
    by_owner: dict[str, list[int]] = {}
    for p in range(table.partitions):
        by_owner.setdefault(owner_of(ctx, table, p), []).append(p)
    if ctx.url in by_owner and not ctx.ready():
        raise Unavailable("state is being restored; retry shortly")
    body = await request.body()
    headers = _forward_headers(ctx, request)

    async def ask(owner: str, partitions: list[int]) -> Any:
        if owner == ctx.url:
            return await local(partitions)
        params = {**request.query_params, LOCAL_SCOPE_PARAM: "local", PARTITIONS_PARAM: ",".join(map(str, partitions))}
        HTTP_FORWARDED.labels(ctx.service).inc()
        return await _owner_part(
            ctx, owner, ctx.http.request(request.method, owner + raw_path(request), params=params, content=body, headers=headers)
        )

    return list(await asyncio.gather(*(ask(o, parts) for o, parts in sorted(by_owner.items()))))


def owned_partitions_named(ctx: ServiceContext, request: Request, owned: set[int]) -> list[int]:
    """The partitions a ``scope=local`` change names; 503 unless this instance still owns them all."""
    raw = request.query_params.get(PARTITIONS_PARAM) or ""
    try:
        partitions = sorted({int(p) for p in raw.split(",") if p})
    except ValueError as exc:
        raise Unprocessable(f"{PARTITIONS_PARAM} must be comma-separated partition numbers") from exc
    moved = [p for p in partitions if p not in owned]
    if moved or ctx.instance.rebalancing or not ctx.ready():
        raise Unavailable(f"partitions {moved or partitions} are not active here any more; retry shortly")
    return partitions


def read_source(request: Request) -> str | None:
    """Which copy this instance is answering ``request`` from (None: it is not reading state)."""
    read_from: ReadFrom | None = getattr(request.state, "read_from", None)
    return read_from.source if read_from is not None else None


def read_from_headers(read_from: ReadFrom | None) -> dict[str, str]:
    """The headers of an answer read from state as ``read_from`` says (empty for any other answer)."""
    if read_from is None:
        return {}
    headers = {SOURCE: read_from.source}
    if read_from.lag is not None:
        headers[LAG] = str(read_from.lag)
    return headers
