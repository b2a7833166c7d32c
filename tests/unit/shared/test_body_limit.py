"""Oversized request bodies get 413, however they are sent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from shared.http.errors import install_error_handlers
from shared.http.limits import BodySizeLimit

LIMIT = 1024


def make_app() -> FastAPI:
    api = FastAPI()
    install_error_handlers(api)
    api.add_middleware(BodySizeLimit, max_bytes=LIMIT)

    @api.post("/echo")
    async def echo(body: dict[str, Any]) -> dict[str, Any]:
        return {"size": len(body["data"])}

    return api


async def chunks(data: bytes, size: int = 100) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def body_of(n: int) -> bytes:
    return b'{"data":"' + b"x" * n + b'"}'


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_bodies_over_the_limit_get_413_and_within_it_reach_the_app(chunked: bool) -> None:
    transport = httpx.ASGITransport(app=make_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:

        def send(data: bytes) -> Any:
            content = chunks(data) if chunked else data
            return client.post("/echo", content=content, headers={"content-type": "application/json"})

        big = await send(body_of(LIMIT * 3))
        assert big.status_code == 413, big.text
        assert big.json()["error"] == "payload_too_large"
        small = await send(body_of(LIMIT - 20))
        assert small.status_code == 200 and small.json() == {"size": LIMIT - 20}
