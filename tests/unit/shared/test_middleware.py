"""The API's middlewares: which instance answered, where a read came from, and query values
refused when they hold control characters or surrounding spaces."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fastapi import Request, Response
from fastapi.testclient import TestClient

from shared.http.api import create_api
from shared.http.forwarding import LAG, SERVED_BY, SOURCE, ReadFrom
from shared.settings import Settings

ME = "http://10.0.0.1:8002"


@pytest.fixture
def client() -> TestClient:
    ctx = SimpleNamespace(settings=Settings(), url=ME, service="tallies", app=None)
    api = create_api(ctx, title="t", description="t")  # type: ignore[arg-type]

    @api.get("/read")
    async def read(request: Request, n: int = 0) -> dict[str, int]:
        request.state.read_from = ReadFrom("standby", 3)
        return {"n": n}

    @api.get("/forwarded")
    async def forwarded() -> Response:
        return Response("{}", media_type="application/json", headers={SERVED_BY: "http://10.0.0.2:8002", SOURCE: "active"})

    return TestClient(api)


def test_every_answer_names_the_instance_that_served_it(client: TestClient) -> None:
    got = client.get("/healthz")
    assert got.status_code == 200 and got.headers[SERVED_BY] == ME
    assert SOURCE not in got.headers and LAG not in got.headers


def test_a_read_from_state_says_which_copy_answered(client: TestClient) -> None:
    got = client.get("/read", params={"n": 5})
    assert got.json() == {"n": 5}
    assert (got.headers[SERVED_BY], got.headers[SOURCE], got.headers[LAG]) == (ME, "standby", "3")


def test_a_forwarded_answer_keeps_the_headers_of_the_instance_that_answered(client: TestClient) -> None:
    got = client.get("/forwarded")
    assert (got.headers[SERVED_BY], got.headers[SOURCE]) == ("http://10.0.0.2:8002", "active")
    assert got.headers.get_list(SERVED_BY) == ["http://10.0.0.2:8002"]


@pytest.mark.parametrize("raw", ["n=%0D5", "n=%205", "n=5%20", "n=5%7F", "m=1&n=%095"])
def test_a_query_value_with_control_characters_or_spaces_is_refused(client: TestClient, raw: str) -> None:
    got = client.get(f"/read?{raw}")
    assert got.status_code == 422, got.text
    body = got.json()
    assert body["error"] == "invalid_request" and body["detail"][0]["loc"] == ["query", "n"]
    assert got.headers[SERVED_BY] == ME


def test_a_plain_query_value_passes(client: TestClient) -> None:
    assert client.get("/read?n=7").json() == {"n": 7}
