"""The API's own middlewares, as plain ASGI.

Starlette's function middlewares (``@app.middleware("http")``) run every request through a
task group and a memory stream of their own; at the peers' 4 probes a second each, that was
most of what an idle instance spent on HTTP. These do the same work on the ASGI messages.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders, QueryParams
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.http.context import ServiceContext
from shared.http.errors import ErrorResponse, error_body
from shared.http.forwarding import SERVED_BY, read_from_headers


class ServedBy:
    """Every answer names the instance that served it (``X-Statefleet-Served-By``; an answer
    forwarded from another instance keeps that one's), and one read from state says where it was read
    from (``read_from_headers``), as the handler left it on the request's state."""

    def __init__(self, app: ASGIApp, ctx: ServiceContext) -> None:
        self.app = app
        self.ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_named(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if SERVED_BY not in headers:
                    headers[SERVED_BY] = self.ctx.url
                # request.state keeps its attributes in the scope's "state" dict.
                for name, value in read_from_headers(scope.get("state", {}).get("read_from")).items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, send_named)


class PlainQueryValues:
    """Query parameters are parsed leniently (pydantic reads "\\r5" or " 5" as 5): a value with
    control characters or surrounding spaces is refused with a 422, as the schema says it must be."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("query_string"):
            for name, value in QueryParams(scope["query_string"]).multi_items():
                if value != value.strip() or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
                    detail = [
                        {"loc": ["query", name], "msg": "holds control characters or surrounding spaces", "type": "value_error"}
                    ]
                    await ErrorResponse(error_body("invalid_request", detail), status_code=422)(scope, receive, send)
                    return
        await self.app(scope, receive, send)
