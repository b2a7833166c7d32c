"""Each service's OpenAPI document tells every error it answers, with the shared error body,
and a 405 names every method the path takes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient

from examples.orders.projection import PROJECTION as ORDERS
from services.retry_scheduler.routes import router as retry_router
from services.tallies.routes import build_router
from services.tallies.routes import router as tallies_router
from services.validator.routes import router as validator_router
from shared.http.api import create_api
from shared.settings import Settings

ROUTERS = {
    "validator": validator_router,
    "tallies": tallies_router,
    "tallies_orders": build_router(ORDERS),
    "retry_scheduler": retry_router,
}


def service_api(router: APIRouter) -> FastAPI:
    ctx = SimpleNamespace(settings=Settings(), url="http://127.0.0.1:1", service="test")
    api = create_api(ctx, title="test", description="test")  # type: ignore[arg-type]
    api.include_router(router)
    return api


def operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, method, op) for path, ops in schema["paths"].items() for method, op in ops.items()]


@pytest.mark.parametrize("service", ROUTERS)
def test_every_error_response_has_the_shared_error_body(service: str) -> None:
    schema = service_api(ROUTERS[service]).openapi()
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    assert set(schema["components"]["schemas"]["ErrorOut"]["required"]) == {"error", "detail"}
    for path, method, op in operations(schema):
        for status, response in op["responses"].items():
            if int(status) >= 400 and path != "/readyz":
                content = response["content"]["application/json"]["schema"]
                assert content == {"$ref": "#/components/schemas/ErrorOut"}, (method, path, status)


EXPECTED = {
    ("post", "/commands"): {"200", "202", "400", "413", "422", "503"},
    ("get", "/commands/{command_id}"): {"200", "404", "422", "503"},
    ("get", "/accounts/{account_id}"): {"200", "404", "422", "503"},
    ("get", "/programs/{program_id}/accounts"): {"200", "400", "422", "503"},
    ("get", "/tallies/{program_id}"): {"200", "404", "422", "503"},
    ("get", "/tallies/{key}"): {"200", "404", "422", "503"},
    ("get", "/tallies"): {"200", "400", "422", "503"},
    ("get", "/retries"): {"200", "400", "401", "422", "503"},
    ("get", "/retries/{dlq_id}"): {"200", "401", "403", "404", "422", "503"},
    ("get", "/scheduled/{dlq_id}"): {"200", "401", "403", "404", "422", "503"},
    ("post", "/retries/{dlq_id}/replay"): {"200", "202", "401", "403", "404", "422", "503"},
    ("delete", "/retries/{dlq_id}"): {"200", "202", "401", "403", "404", "422", "503"},
    ("get", "/parked"): {"200", "400", "401", "422", "503"},
    ("get", "/parked/{dlq_id}"): {"200", "401", "403", "404", "422", "503"},
    ("post", "/parked/{dlq_id}/replay"): {"200", "202", "401", "403", "404", "422", "503"},
    ("delete", "/parked/{dlq_id}"): {"200", "202", "401", "403", "404", "422", "503"},
    ("post", "/parked-groups/{action}"): {"200", "401", "403", "422", "503"},
    ("post", "/ordered-keys/replay-head"): {"200", "202", "401", "403", "404", "409", "422", "503"},
    ("get", "/readyz"): {"200", "503"},
}


@pytest.mark.parametrize("service", ROUTERS)
def test_the_statuses_each_operation_can_answer_are_documented(service: str) -> None:
    schema = service_api(ROUTERS[service]).openapi()
    documented = {(method, path): set(op["responses"]) for path, method, op in operations(schema)}
    expected = {k: v for k, v in EXPECTED.items() if k in documented}
    assert len(expected) >= 3
    assert {k: documented[k] for k in expected} == expected
    assert documented[("get", "/metrics")] == {"200"}


@pytest.mark.parametrize(
    ("service", "method", "path", "allow"),
    [
        ("retry_scheduler", "PUT", "/retries/x", "GET, DELETE"),
        ("retry_scheduler", "OPTIONS", "/parked/x/replay", "POST"),  # not GET of the parked id "x/replay"
        ("retry_scheduler", "PUT", "/retries/x/replay", "POST"),
        ("retry_scheduler", "OPTIONS", "/retries/stats", "GET"),
        ("retry_scheduler", "PATCH", "/parked/a/b", "GET, DELETE"),  # the parked id "a/b" (DELETE /parked/{id})
        ("validator", "PATCH", "/commands", "POST"),
        ("tallies", "POST", "/tallies/a/b", "GET"),
        ("tallies", "DELETE", "/healthz", "GET"),
        ("tallies_orders", "POST", "/tallies/a/b", "GET"),
    ],
)
def test_405_names_every_method_the_path_takes(service: str, method: str, path: str, allow: str) -> None:
    r = TestClient(service_api(ROUTERS[service]), raise_server_exceptions=False).request(method, path)
    assert r.status_code == 405
    assert r.headers["allow"] == allow
    assert r.json()["error"] == "method_not_allowed"


@pytest.mark.parametrize("service", ROUTERS)
def test_every_read_from_state_documents_max_lag_and_its_source_headers(service: str) -> None:
    schema = service_api(ROUTERS[service]).openapi()
    reads = [
        (path, op) for path, method, op in operations(schema) if any(p["name"] == "max_lag" for p in op.get("parameters", ()))
    ]
    assert reads, "no operation of this service documents max_lag"
    for path, op in reads:
        headers = op["responses"]["200"]["headers"]
        assert {"X-Statefleet-Source", "X-Statefleet-Lag-Records"} <= set(headers), path
        assert "max_lag" in op["responses"]["503"]["description"], path


@pytest.mark.parametrize("value", ["\r5", " 5", "5 ", "5\n", "\x7f5"])
def test_query_values_with_control_characters_or_spaces_are_refused(value: str) -> None:
    client = TestClient(service_api(ROUTERS["tallies"]))
    resp = client.get("/tallies", params={"limit": value})
    assert resp.status_code == 422
    assert resp.json()["error"] == "invalid_request"
    assert resp.json()["detail"][0]["loc"] == ["query", "limit"]


def test_the_retry_scheduler_documents_its_bearer_tokens() -> None:
    schema = service_api(retry_router).openapi()
    assert schema["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": schema["components"]["securitySchemes"]["bearer"]["description"],
    }
    ops = {(method, path): op for path, method, op in operations(schema)}
    for key in [("post", "/parked/{dlq_id}/replay"), ("delete", "/parked/{dlq_id}"), ("post", "/parked-groups/{action}")]:
        assert ops[key]["security"] == [{"bearer": []}], key
    for key in [("get", "/parked/{dlq_id}"), ("get", "/retries/{dlq_id}"), ("get", "/parked")]:
        assert ops[key]["security"] == [{"bearer": []}, {}], key  # optional: needed only with STATEFLEET_PAYLOADS_REQUIRE_TOKEN
    assert "security" not in ops[("get", "/retries/stats")]
    forbidden = ops[("post", "/parked/{dlq_id}/replay")]["responses"]["403"]
    assert "names the token, the topic and the scope" in forbidden["description"]
    error_fields = schema["components"]["schemas"]["ErrorOut"]["properties"]
    assert {"token", "topic", "scope"} <= set(error_fields)
