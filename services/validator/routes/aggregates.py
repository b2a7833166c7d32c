"""GET /aggregates/{aggregate_id} for every domain, and the accounts domain's own reads:
GET /accounts/{account_id} and GET /programs/{program_id}/accounts. An aggregate lives with the
owner of its id's partition of the state table, a program's listing with the owner of its
program_id's partition of ``program-accounts``; other instances forward."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

import shared.http.paths  # noqa: F401  (registers the {name:id} path convertor)
from services.validator.domain import account_json
from services.validator.handlers.program_listings import ProgramListings
from services.validator.models import AccountOut, AggregateOut, ProgramAccountsPage
from services.validator.routes.common import IdPath, validator
from services.validator.state import listing_cursor, listing_key_from_cursor
from shared.domain import Aggregate
from shared.http.context import ServiceContext
from shared.http.deps import Ctx, owned_key
from shared.http.errors import ApiError, NotFound, error_responses
from shared.http.pagination import CursorParam, InvalidCursor, decode_cursor, encode_cursor

#: The routes of every domain.
router = APIRouter()
#: The accounts domain's own reads.
accounts_routes = APIRouter()

#: Names GET /programs/{program_id}/accounts in its cursors.
LISTING = "program-accounts"


async def _aggregate_id(aggregate_id: IdPath) -> str:
    return aggregate_id


#: An aggregate id this instance answers for (the owner of its partition of the state table).
OwnedAggregate = Annotated[str, owned_key(_aggregate_id, lambda ctx: validator(ctx).commands.store)]


@router.get(
    "/aggregates/{aggregate_id:id}",
    response_model=AggregateOut,
    summary="An aggregate's current state and version, as the domain's state_to_json gives it",
    responses=error_responses(404, 503, _404="The aggregate never existed"),
)
async def get_aggregate(aggregate_id: OwnedAggregate, ctx: Ctx) -> Any:
    return validator(ctx).domain.aggregate_json(_found(ctx, aggregate_id))


def _found(ctx: ServiceContext, aggregate_id: str) -> Aggregate[Any]:
    """The aggregate (read here, by its owner or from a copy), or 404."""
    svc = validator(ctx)
    aggregate = svc.commands.aggregate(aggregate_id)
    if aggregate is None:
        raise NotFound(f"no {svc.domain.noun} {aggregate_id!r}")
    return aggregate


async def _account_id(account_id: IdPath) -> str:
    return account_id


#: An account id this instance answers for (the owner of its partition of accounts).
Account = Annotated[str, owned_key(_account_id, lambda ctx: validator(ctx).commands.store)]


@accounts_routes.get(
    "/accounts/{account_id:id}",
    response_model=AccountOut,
    summary="An account's current status and version",
    responses=error_responses(404, 503, _404="The account never existed"),
)
async def get_account(account_id: Account, ctx: Ctx) -> Any:
    aggregate = _found(ctx, account_id)
    return account_json(aggregate.aggregate_id, aggregate.version, aggregate.state)


async def _program_id(program_id: IdPath) -> str:
    return program_id


def _listings(ctx: ServiceContext) -> ProgramListings:
    listings = validator(ctx).program_listings
    assert listings is not None, "the program listings are routed for the accounts domain only"
    return listings


def _no_nul(program_id: str) -> None:
    if "\x00" in program_id:
        raise ApiError("program_id must not contain NUL")


#: A program id whose listing this instance answers for (the owner of its partition of program-accounts).
ListedProgram = Annotated[str, owned_key(_program_id, lambda ctx: _listings(ctx).store, check=_no_nul)]


@accounts_routes.get(
    "/programs/{program_id:id}/accounts",
    response_model=ProgramAccountsPage,
    summary="A program's accounts with their status, newest first (the category projection)",
    responses=error_responses(400, 422, 503, _400="A cursor this API did not make, or a program id holding NUL"),
)
async def list_program_accounts(
    program_id: ListedProgram,
    ctx: Ctx,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: CursorParam = None,
    status: Annotated[
        Literal["active", "inactive", "deleted"] | None, Query(description="Only accounts with this status")
    ] = None,
) -> Any:
    before = None
    text = decode_cursor(cursor, LISTING)
    if text is not None:
        try:
            before = listing_key_from_cursor(program_id, text)
        except ValueError as exc:
            raise InvalidCursor("cursor is not one this API returned") from exc
    items, more = _listings(ctx).list_program(program_id, limit=limit, before=before, status=status)
    return {
        "items": [item.to_json() for item in items],
        "next_cursor": encode_cursor(listing_cursor(items[-1]), LISTING) if more and items else None,
    }


# -- batches ---------------------------------------------------------------------------------
