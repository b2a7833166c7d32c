"""FastAPI dependencies, in one place."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Header, Request

from shared.http.context import ServiceContext
from shared.http.errors import Unauthorized


def get_context(request: Request) -> ServiceContext:
    ctx: ServiceContext = request.app.state.ctx
    return ctx


Ctx = Annotated[ServiceContext, Depends(get_context)]


def require_admin(ctx: Ctx, authorization: Annotated[str | None, Header()] = None) -> None:
    """Changing calls need ``Authorization: Bearer <STATEFLEET_ADMIN_TOKEN>``."""
    if not authorization or not authorization.startswith("Bearer "):
        raise Unauthorized()
    token = authorization.removeprefix("Bearer ").strip()
    if not hmac.compare_digest(token.encode(), ctx.settings.admin_token.encode()):
        raise Unauthorized("the bearer token is not valid")


Admin = Depends(require_admin)
