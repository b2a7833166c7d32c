"""HTTP: GET /tallies/{key} and GET /tallies (paginated), for the projection the service runs.

The path parameter is named after the projection's ``key_field`` (``program_id`` for the
accounts tallies) and the responses follow its ``row_model``."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field, create_model

import shared.http.paths  # noqa: F401  (registers the {name:id} path convertor)
from services.tallies.app import TalliesService
from services.tallies.domain import PROJECTION
from shared.http.context import ServiceContext, service_of
from shared.http.deps import Ctx, owned_key
from shared.http.errors import NotFound, error_responses
from shared.http.forwarding import READS_STATE, gather, is_local_scope, local_scope_partitions
from shared.http.pagination import CursorParam, decode_cursor, encode_cursor, merge_pages
from shared.projection import Projection

#: Names GET /tallies in its cursors.
LIST_NAME = "tallies"
#: Longest key looked up (the validator accepts no program id longer than 256).
MAX_PROGRAM_ID_LENGTH = 1024


def tallies(ctx: ServiceContext) -> TalliesService:
    """The tallies service behind ``ctx``."""
    return service_of(ctx, TalliesService)


def _key_of_path(name: str) -> Callable[..., Awaitable[str]]:
    """A dependency that takes the path parameter ``name`` (the projection's key field)."""

    async def key_of_path(**params: str) -> str:
        return params[name]

    annotation = Annotated[str, Path(min_length=1, max_length=MAX_PROGRAM_ID_LENGTH)]
    key_of_path.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation)], return_annotation=str
    )
    return key_of_path


def page_model(row_model: type[BaseModel]) -> type[BaseModel]:
    """The body of GET /tallies: a page of rows."""
    return create_model(
        "TallyPage",
        items=(list[row_model], ...),  # type: ignore[valid-type]
        next_cursor=(str | None, Field(description="Pass as ?cursor= to get the next page; null on the last page")),
    )


def build_router(projection: Projection) -> APIRouter:
    """The routes of the tallies service running ``projection``."""
    router = APIRouter(tags=["tallies"])
    key_field = projection.key_field
    #: A key whose row this instance answers for (the owner of its partition of memberships).
    TalliedKey = Annotated[str, owned_key(_key_of_path(key_field), lambda ctx: tallies(ctx).memberships_store)]

    async def get_tally(key: str, ctx: Ctx) -> Any:
        row = tallies(ctx).by_program.tally(key)
        if row is None:
            raise NotFound(f"no tally for {key_field} {key!r}")
        return row

    # The key's dependency is made here, for this projection: its annotation is set as an
    # object (this module's annotations are strings, which FastAPI resolves at module level).
    get_tally.__annotations__["key"] = TalliedKey
    router.get(
        f"/tallies/{{{key_field}:id}}",
        response_model=projection.row_model,
        responses=error_responses(404, 503, _404=f"Nothing seen yet for this {key_field}"),
    )(get_tally)

    @router.get(
        "/tallies",
        response_model=page_model(projection.row_model),
        summary=f"All tallies, ordered by {key_field}",
        responses=error_responses(400, 422, 503, _400="A cursor this API did not make"),
        dependencies=[READS_STATE],
    )
    async def list_tallies(
        request: Request, ctx: Ctx, limit: Annotated[int, Query(ge=1, le=1000)] = 100, cursor: CursorParam = None
    ) -> Any:
        svc = tallies(ctx)
        after = decode_cursor(cursor, LIST_NAME)

        async def local_page(partitions: list[int]) -> dict[str, Any]:
            keys = sorted(p for p in svc.by_program.programs_in(partitions) if after is None or p > after)[:limit]
            items = [row for row in (svc.by_program.tally(k) for k in keys) if row is not None]
            return {"items": items, "next_cursor": None}

        if is_local_scope(request):
            return await local_page(
                await local_scope_partitions(ctx, request, svc.memberships_store, svc.by_program.owned_partitions())
            )
        pages = await gather(ctx, request, svc.memberships_store, local_page)
        items = merge_pages(pages, key=key_field, limit=limit)
        next_cursor = encode_cursor(items[-1][key_field], LIST_NAME) if len(items) == limit else None
        return {"items": items, "next_cursor": next_cursor}

    return router


#: The routes with the bundled default projection (the accounts tallies).
router = build_router(PROJECTION)
