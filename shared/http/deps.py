"""FastAPI dependencies, in one place."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.dependencies.utils import request_params_to_args
from fastapi.params import Depends as Dependency
from fastapi.routing import APIRoute

from shared.engine import Table
from shared.http.context import ServiceContext
from shared.http.errors import Unauthorized, Unprocessable
from shared.http.forwarding import PARTITION_ASKED, AnsweredElsewhere, answer_here, ask_about_partition, max_lag_param

# The dependencies are coroutines although they do not wait: FastAPI runs a plain function
# dependency in a worker thread, a hop for every request (peers probe /healthz 4 times a second).


async def get_context(request: Request) -> ServiceContext:
    ctx: ServiceContext = request.app.state.ctx
    return ctx


Ctx = Annotated[ServiceContext, Depends(get_context)]


async def require_admin(ctx: Ctx, authorization: Annotated[str | None, Header()] = None) -> None:
    """Changing calls need ``Authorization: Bearer <STATEFLEET_ADMIN_TOKEN>``."""
    if not authorization or not authorization.startswith("Bearer "):
        raise Unauthorized()
    token = authorization.removeprefix("Bearer ").strip()
    if not hmac.compare_digest(token.encode(), ctx.settings.admin_token.encode()):
        raise Unauthorized("the bearer token is not valid")


Admin = Depends(require_admin)

#: ``?max_lag``, for a dependency that reads state (an endpoint declares ``READS_STATE`` instead).
MaxLag = Annotated[int | None, Depends(max_lag_param)]

#: The dependency that gives a route's key from its path (and checks it, as the route would first).
KeyOfPath = Callable[..., Awaitable[str]]
TableOf = Callable[[ServiceContext], Table]
PartitionOf = Callable[[ServiceContext, str], int]


def _partition_for(ctx: ServiceContext, key: str) -> int:
    return ctx.partition_for(key)


def owned_key(
    key: KeyOfPath,
    table: TableOf,
    partition: PartitionOf = _partition_for,
    *,
    reads: bool = True,
    check: Callable[[str], None] | None = None,
) -> Dependency:
    """The key of a route that reads (``reads``) or changes one key's state in ``table``,
    once this instance is the one to answer for it.

    A route declares ``Annotated[str, owned_key(...)]`` for its key and its body holds only its
    own logic: the owner of the key's partition answers, or a copy when the owner does not
    (for reads; see :func:`shared.http.forwarding.route`), and any other instance passes on
    that instance's answer, status, headers and body unchanged. A read also takes ``?max_lag``.

    A request that the route would refuse (422) is refused here, never forwarded: FastAPI
    validates a route's own query parameters only after its dependencies ran, so they are
    checked first; then ``check`` (which raises the route's own refusal of the key).
    """

    async def answered_here(request: Request, ctx: Ctx, owned: str) -> str:
        if _query_valid(request):
            if check is not None:
                check(owned)
            await answer_here(ctx, request, table(ctx), partition(ctx, owned))
        return owned

    # ``max_lag`` before the key, as an endpoint's READS_STATE comes before its own parameters:
    # a request with both wrong lists its errors in the same order either way.
    async def read(request: Request, ctx: Ctx, max_lag: MaxLag, owned: str = Depends(key)) -> str:
        return await answered_here(request, ctx, owned)

    async def change(request: Request, ctx: Ctx, owned: str = Depends(key)) -> str:
        return await answered_here(request, ctx, owned)

    return Dependency(read if reads else change)


@dataclass(frozen=True, slots=True)
class Located:
    """A route's key and the partition it answers for: where the key was found, or its home
    partition where no partition holds it."""

    key: str
    partition: int


#: The partitions a key may be in, its home partition (where it usually is) first.
PlacesOf = Callable[[ServiceContext, str], Sequence[int]]
#: Whether this instance's copy of a partition holds anything of a key.
HoldsKey = Callable[[ServiceContext, str, int], bool]


def located_key(key: KeyOfPath, table: TableOf, places: PlacesOf, holds: HoldsKey, *, reads: bool = True) -> Dependency:
    """As :func:`owned_key`, for a key that may be in any of several partitions of ``table``.

    The partitions ``places`` lists are asked in turn, each where :func:`owned_key` would ask
    (here, through ``holds``, or forwarded with ``X-Statefleet-Partition``), until one holds
    the key: it answers. Where none does, the home partition answers (its 404 can say what it
    knows of the key). A request that names its partition in ``X-Statefleet-Partition`` is
    asked of that partition alone. With one place, this is :func:`owned_key`.
    """

    async def located(request: Request, ctx: Ctx, owned: str) -> Located:
        candidates = places(ctx, owned)
        if not _query_valid(request):
            return Located(owned, candidates[0])  # the route refuses it
        asked = _partition_asked(request, ctx)
        if asked is not None:
            candidates = [asked]
        home = candidates[0]
        home_answer: AnsweredElsewhere | None = None
        for partition in candidates:
            if len(candidates) > 1:
                ask_about_partition(request, partition)
            try:
                await answer_here(ctx, request, table(ctx), partition)
            except AnsweredElsewhere as elsewhere:
                if elsewhere.response.status_code != 404 or len(candidates) == 1:
                    raise
                if partition == home:
                    home_answer = elsewhere
                continue
            if len(candidates) == 1 or holds(ctx, owned, partition):
                return Located(owned, partition)
        if home_answer is not None:
            raise home_answer
        # The home partition is answered here: once more, so that its answer says where it read from.
        ask_about_partition(request, home)
        await answer_here(ctx, request, table(ctx), home)
        return Located(owned, home)

    async def read(request: Request, ctx: Ctx, max_lag: MaxLag, owned: str = Depends(key)) -> Located:
        return await located(request, ctx, owned)

    async def change(request: Request, ctx: Ctx, owned: str = Depends(key)) -> Located:
        return await located(request, ctx, owned)

    return Dependency(read if reads else change)


def _partition_asked(request: Request, ctx: ServiceContext) -> int | None:
    raw = request.headers.get(PARTITION_ASKED)
    if raw is None:
        return None
    n = ctx.settings.topic_partitions
    if not raw.isdigit() or int(raw) >= n:
        raise Unprocessable(f"{PARTITION_ASKED} must be a partition number from 0 to {n - 1}; got {raw!r}")
    return int(raw)


def _query_valid(request: Request) -> bool:
    """Whether the route's own query parameters validate (its dependencies' have by now)."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return True
    _, errors = request_params_to_args(route.dependant.query_params, request.query_params)
    return not errors
