"""A forwarded query reaches the owner at the same resource the client asked for."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote

import httpx
from starlette.requests import Request

from shared.http.forwarding import FORWARDED_BY, forward


@dataclass
class FakeContext:
    seen: list[httpx.Request] = field(default_factory=list)
    service: str = "tallies"
    url: str = "http://me:1"

    @property
    def http(self) -> httpx.AsyncClient:
        def answer(request: httpx.Request) -> httpx.Response:
            self.seen.append(request)
            return httpx.Response(200, json={"ok": True})

        return httpx.AsyncClient(transport=httpx.MockTransport(answer))


def request_for(raw_path: bytes, query: bytes = b"") -> Request:
    scope = {
        "type": "http",
        "method": "GET",
        "scheme": "http",
        "server": ("me", 1),
        "root_path": "",
        "path": unquote(raw_path.decode()),
        "raw_path": raw_path,
        "query_string": query,
        "headers": [],
    }

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    return Request(scope, receive)


async def test_ids_with_reserved_characters_are_forwarded_still_encoded() -> None:
    ctx = FakeContext()
    raw = b"/tallies/a%3Fb%2Fc%23d%25e"
    resp = await forward(ctx, request_for(raw, b"limit=3"), "http://owner:2")  # type: ignore[arg-type]
    assert resp.status_code == 200
    [sent] = ctx.seen
    assert sent.url.raw_path == raw + b"?limit=3"
    assert sent.headers[FORWARDED_BY] == ctx.url
