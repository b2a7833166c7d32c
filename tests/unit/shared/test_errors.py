"""Unexpected errors: a 500 with a JSON body and the traceback in the log."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from shared.http.api import create_api
from shared.settings import Settings


def api_raising(exc: Exception) -> TestClient:
    ctx = SimpleNamespace(settings=Settings(), url="http://10.0.0.1:8002", service="tallies", app=None)
    api = create_api(ctx, title="t", description="t")  # type: ignore[arg-type]

    @api.get("/boom")
    async def boom() -> None:
        raise exc

    return TestClient(api, raise_server_exceptions=False)


def test_an_unexpected_error_is_a_500_with_the_traceback_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="shared.http.errors"):
        got = api_raising(RuntimeError("kaput")).get("/boom")
    assert got.status_code == 500 and got.json()["error"] == "internal_error"
    assert [r.levelno for r in caplog.records] == [logging.ERROR] and caplog.records[0].exc_info
