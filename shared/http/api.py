"""The FastAPI app every service starts from."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response

from shared.http.context import ServiceContext
from shared.http.errors import install_error_handlers
from shared.http.forwarding import SERVED_BY
from shared.http.health import router as health_router
from shared.http.instance import router as instance_router
from shared.http.limits import BodySizeLimit


def create_api(ctx: ServiceContext, *, title: str, description: str, version: str = "1.0.0") -> FastAPI:
    api = FastAPI(title=title, description=description, version=version)
    api.state.ctx = ctx
    install_error_handlers(api)
    api.add_middleware(BodySizeLimit, max_bytes=ctx.settings.max_body_bytes)

    @api.middleware("http")
    async def served_by(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        if SERVED_BY not in response.headers:
            response.headers[SERVED_BY] = ctx.url
        return response

    api.include_router(health_router)
    api.include_router(instance_router)
    return api
