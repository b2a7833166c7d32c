"""HTTP: GET /tallies/{program_id} and GET /tallies (paginated)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request

import shared.http.paths  # noqa: F401  (registers the {name:id} path convertor)
from services.tallies.models import TallyOut, TallyPage
from shared.http.deps import Ctx, owned_key
from shared.http.errors import NotFound, error_responses
from shared.http.forwarding import READS_STATE, gather, is_local_scope, local_scope_partitions
from shared.http.pagination import CursorParam, decode_cursor, encode_cursor, merge_pages

router = APIRouter(tags=["tallies"])

#: Names GET /tallies in its cursors.
LIST_NAME = "tallies"
#: Longest program id looked up (the validator accepts none longer than 256).
MAX_PROGRAM_ID_LENGTH = 1024
ProgramId = Annotated[str, Path(min_length=1, max_length=MAX_PROGRAM_ID_LENGTH)]


def _service(ctx: Any) -> Any:
    return ctx.extras["service"]


async def _program_id(program_id: ProgramId) -> str:
    return program_id


#: A program id whose tally this instance answers for (the owner of its partition of memberships).
TalliedProgram = Annotated[str, owned_key(_program_id, lambda ctx: _service(ctx).memberships_store)]


@router.get(
    "/tallies/{program_id:id}",
    response_model=TallyOut,
    responses=error_responses(404, 503, _404="No account or login seen for this program"),
)
async def get_tally(program_id: TalliedProgram, ctx: Ctx) -> Any:
    tally = _service(ctx).tally(program_id)
    if tally is None:
        raise NotFound(f"no tally for program {program_id!r}")
    return tally.to_json()


@router.get(
    "/tallies",
    response_model=TallyPage,
    summary="All tallies, ordered by program_id",
    responses=error_responses(400, 422, 503, _400="A cursor this API did not make"),
    dependencies=[READS_STATE],
)
async def list_tallies(
    request: Request, ctx: Ctx, limit: Annotated[int, Query(ge=1, le=1000)] = 100, cursor: CursorParam = None
) -> Any:
    svc = _service(ctx)
    after = decode_cursor(cursor, LIST_NAME)

    async def local_page(partitions: list[int]) -> dict[str, Any]:
        programs = sorted(p for p in svc.programs_in(partitions) if after is None or p > after)[:limit]
        items = [t.to_json() for t in (svc.tally(p) for p in programs) if t is not None]
        return {"items": items, "next_cursor": None}

    if is_local_scope(request):
        return await local_page(await local_scope_partitions(ctx, request, svc.memberships_store, svc.owned_partitions()))
    pages = await gather(ctx, request, svc.memberships_store, local_page)
    items = merge_pages(pages, key="program_id", limit=limit)
    next_cursor = encode_cursor(items[-1]["program_id"], LIST_NAME) if len(items) == limit else None
    return {"items": items, "next_cursor": next_cursor}
