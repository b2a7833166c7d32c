"""HTTP: POST /commands, GET /commands/{command_id}, GET /aggregates/{aggregate_id}, batches;
for the accounts domain also GET /accounts/{account_id} and GET /programs/{program_id}/accounts.

:func:`build_router` makes the routes of one domain: ``POST /commands`` takes the domain's
command model (so its OpenAPI is the domain's schema), ``GET /commands/{command_id}`` answers
with the aggregate id under the domain's field.

Any instance answers any id: a command's outcome lives with the owner of its
command_id's partition of ``outcomes``, an aggregate with the owner of its id's
partition of ``accounts``, a program's listing with the owner of its program_id's
partition of ``program-accounts``; other instances forward. One module per resource:
:mod:`.commands`, :mod:`.aggregates`, :mod:`.batches`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from services.validator.domain import ACCOUNTS
from services.validator.models import command_status_model
from services.validator.routes import aggregates, batches, commands
from shared.domain import Domain
from shared.http.errors import error_responses


def build_router(domain: Domain[Any]) -> APIRouter:
    """The validator's routes for ``domain``."""
    router = APIRouter(tags=["validator"])
    commands.post_command_route(router, domain)
    router.get(
        "/commands/{command_id:id}",
        response_model=command_status_model(domain),
        summary="A command's status: pending, accepted (with its event) or rejected (with the reason)",
        responses=error_responses(
            404,
            422,
            503,
            _404="No command with this id was submitted or answered",
            _503="State is being restored, or the outcomes are still being recorded; retry",
        ),
    )(commands.get_command)
    router.include_router(aggregates.router)
    router.include_router(batches.router)
    if domain is ACCOUNTS:
        router.include_router(aggregates.accounts_routes)
    return router


#: The accounts domain's routes.
router = build_router(ACCOUNTS)
