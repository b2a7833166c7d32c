"""What every route module of the validator shares: the service, typed, and ids in paths."""

from __future__ import annotations

from typing import Annotated, Any

import httpx
from fastapi import Path

from services.validator.app import ValidatorService
from shared import codecs
from shared.domain import MAX_ID_LENGTH
from shared.http.context import ServiceContext, service_of
from shared.http.errors import Unavailable
from shared.http.forwarding import FORWARDED_BY
from shared.metrics import HTTP_FORWARDED

#: Ids in paths: none longer is ever accepted, so none longer can be found.
IdPath = Annotated[str, Path(min_length=1, max_length=MAX_ID_LENGTH)]


def validator(ctx: ServiceContext) -> ValidatorService:
    """The validator service behind ``ctx``."""
    return service_of(ctx, ValidatorService)


async def ask_owner(
    ctx: ServiceContext, owner: str, path: str, params: dict[str, Any], *, within_s: float
) -> dict[str, Any] | None:
    """GET ``path`` from the instance that owns it: its JSON body, or None for its 404."""
    HTTP_FORWARDED.labels(ctx.service).inc()
    try:
        resp = await ctx.http.get(f"{owner}{path}", params=params, headers={FORWARDED_BY: ctx.url}, timeout=within_s)
    except httpx.HTTPError as exc:
        raise Unavailable(f"the owning instance {owner} did not answer; retry shortly") from exc
    if resp.status_code == 404:
        return None
    if resp.status_code != 200:
        raise Unavailable(f"the owning instance {owner} answered {resp.status_code}; retry shortly")
    body: dict[str, Any] = codecs.loads_object(resp.content)
    return body
