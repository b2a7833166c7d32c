"""HTTP: GET /tallies/{program_id} and GET /tallies (paginated)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from services.tallies.models import TallyOut, TallyPage
from shared.http.deps import Ctx
from shared.http.errors import NotFound
from shared.http.forwarding import gather, is_local_scope, route
from shared.http.pagination import CursorParam, decode_cursor, encode_cursor, merge_pages

router = APIRouter(tags=["tallies"])

#: Names GET /tallies in its cursors.
LIST_NAME = "tallies"


def _service(ctx: Any) -> Any:
    return ctx.extras["service"]


@router.get(
    "/tallies/{program_id:path}",
    response_model=TallyOut,
    responses={404: {"description": "No account or login seen for this program"}, 503: {"description": "Owner recovering"}},
)
async def get_tally(program_id: str, request: Request, ctx: Ctx) -> Any:
    svc = _service(ctx)
    forwarded = await route(ctx, request, svc.memberships, ctx.partition_for(program_id))
    if forwarded is not None:
        return forwarded
    tally = svc.tally(program_id)
    if tally is None:
        raise NotFound(f"no tally for program {program_id!r}")
    return tally.to_json()


@router.get("/tallies", response_model=TallyPage, summary="All tallies, ordered by program_id")
async def list_tallies(
    request: Request,
    ctx: Ctx,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: CursorParam = None,
) -> Any:
    svc = _service(ctx)
    after = decode_cursor(cursor, LIST_NAME)

    async def local_page() -> dict[str, Any]:
        programs = sorted(p for p in svc.local_programs() if after is None or p > after)[:limit]
        items = [t.to_json() for t in (svc.tally(p) for p in programs) if t is not None]
        return {"items": items, "next_cursor": None}

    if is_local_scope(request):
        return await local_page()
    pages = await gather(ctx, request, svc.memberships, local_page)
    items = merge_pages(pages, key="program_id", limit=limit)
    next_cursor = encode_cursor(items[-1]["program_id"], LIST_NAME) if len(items) == limit else None
    return {"items": items, "next_cursor": next_cursor}


