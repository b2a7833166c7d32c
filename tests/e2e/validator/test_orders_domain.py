"""The validator running the orders example domain (``examples.orders.domain:ORDERS``) end to
end against the broker: every rule and rejection of the contract over POST /commands and on
the domain's topics, idempotent command ids, expected_version, GET /commands and
GET /aggregates, batches, commands written straight to ``order-commands``, its OpenAPI (and
fuzzing from it), and a domain that cannot be loaded stopping the worker at start."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.e2e.test_api_fuzz import schemathesis
from tests.e2e.validator.conftest import module_validator
from tests.support.kafka import produce, read_all
from tests.support.services import REPO, ServiceProcess, wait_for
from tools import web

pytestmark = pytest.mark.e2e

DOMAIN = "examples.orders.domain:ORDERS"
AMOUNT = 4200


@pytest.fixture(scope="module")
def orders(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """One validator instance running the orders domain, with a topic prefix of its own."""
    yield from module_validator(kafka_bootstrap, tmp_path_factory, "orders", STATEFLEET_VALIDATOR_DOMAIN=DOMAIN)


def post(proc: ServiceProcess, body: dict[str, Any]) -> dict[str, Any]:
    resp = web.post(proc.url + "/commands", json=body, params={"wait": "true"}, timeout=15)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def get(proc: ServiceProcess, path: str) -> httpx.Response:
    return web.get(proc.url + path, timeout=15)


def topic(proc: ServiceProcess, base: str) -> str:
    return proc.env["STATEFLEET_TOPIC_PREFIX"] + base


def records(proc: ServiceProcess, base: str, key: str) -> list[dict[str, Any]]:
    return [orjson.loads(r.body) for r in read_all(topic(proc, base)) if r.key == key.encode()]


class Orders:
    """Commands for one fresh order id each, numbered."""

    def __init__(self) -> None:
        self.run = uuid.uuid4().hex[:8]
        self.n = 0

    def order(self) -> str:
        self.n += 1
        return f"order-{self.run}-{self.n}"

    def command(self, type_: str, order_id: str, **kw: Any) -> dict[str, Any]:
        self.n += 1
        return {
            "command_id": f"cmd-{self.run}-{self.n}",
            "type": type_,
            "order_id": order_id,
            "issued_at": 1_700_000_000_000,
            **kw,
        }

    def place(self, order_id: str, **kw: Any) -> dict[str, Any]:
        return self.command("PlaceOrder", order_id, customer_id="cust-1", data={"amount_cents": AMOUNT}, **kw)


def accepted(out: dict[str, Any], event_type: str, version: int) -> dict[str, Any]:
    assert out["status"] == "accepted", out
    assert (out["event"]["type"], out["event"]["version"]) == (event_type, version), out
    event: dict[str, Any] = out["event"]
    return event


def rejected(out: dict[str, Any], reason: str, current_version: int | None) -> None:
    assert out["status"] == "rejected", out
    assert out["reason"] == reason and out["rejection"]["reason"] == reason, out
    assert out["rejection"]["current_version"] == current_version, out
    assert out["event"] is None and out["detail"]


def test_an_order_through_its_life_on_the_api_and_the_topics(orders: ServiceProcess) -> None:
    o = Orders()
    oid = o.order()
    placed = post(orders, o.place(oid))
    assert placed["aggregate_id"] == oid and "account_id" not in placed
    event = accepted(placed, "OrderPlaced", 1)
    assert {k: v for k, v in event.items() if k != "event_id"} == {
        "command_id": placed["command_id"],
        "type": "OrderPlaced",
        "aggregate_id": oid,
        "version": 1,
        "occurred_at": 1_700_000_000_000,
        "data": {"customer_id": "cust-1", "amount_cents": AMOUNT},
    }
    accepted(post(orders, o.command("PayOrder", oid, expected_version=1)), "OrderPaid", 2)
    rejected(post(orders, o.command("PayOrder", oid)), "INVALID_TRANSITION", 2)
    accepted(post(orders, o.command("ShipOrder", oid)), "OrderShipped", 3)
    rejected(post(orders, o.command("CancelOrder", oid)), "INVALID_TRANSITION", 3)
    rejected(post(orders, o.command("ShipOrder", oid)), "INVALID_TRANSITION", 3)

    events = wait_for(lambda: (e := records(orders, "order-events", oid)) and len(e) == 3 and e, message="3 events")
    assert [(e["type"], e["version"], e["aggregate_id"]) for e in events] == [
        ("OrderPlaced", 1, oid),
        ("OrderPaid", 2, oid),
        ("OrderShipped", 3, oid),
    ]
    assert all(e["data"] == {"customer_id": "cust-1", "amount_cents": AMOUNT} for e in events)
    rejections = wait_for(lambda: (r := records(orders, "order-rejections", oid)) and len(r) == 3 and r, message="rejections")
    assert [set(r) for r in rejections] == [{"command_id", "aggregate_id", "reason", "detail", "current_version"}] * 3
    assert [r["reason"] for r in rejections] == ["INVALID_TRANSITION"] * 3

    resp = get(orders, f"/aggregates/{oid}")
    assert resp.status_code == 200, resp.text
    assert resp.json() == {
        "aggregate_id": oid,
        "version": 3,
        "state": {"status": "shipped", "customer_id": "cust-1", "amount_cents": AMOUNT},
    }


@pytest.mark.parametrize(
    ("steps", "last", "outcome"),
    [
        ([], "CancelOrder", ("accepted", "OrderCancelled", 2)),
        (["PayOrder"], "CancelOrder", ("accepted", "OrderCancelled", 3)),
        ([], "ShipOrder", ("rejected", "INVALID_TRANSITION", 1)),
        (["CancelOrder"], "PayOrder", ("rejected", "INVALID_TRANSITION", 2)),
        (["CancelOrder"], "CancelOrder", ("rejected", "INVALID_TRANSITION", 2)),
        (["CancelOrder"], "ShipOrder", ("rejected", "INVALID_TRANSITION", 2)),
    ],
)
def test_rules_table(orders: ServiceProcess, steps: list[str], last: str, outcome: tuple[str, str, int]) -> None:
    o = Orders()
    oid = o.order()
    accepted(post(orders, o.place(oid)), "OrderPlaced", 1)
    for n, step in enumerate(steps, start=2):
        assert post(orders, o.command(step, oid))["event"]["version"] == n
    out = post(orders, o.command(last, oid))
    status, what, version = outcome
    if status == "accepted":
        accepted(out, what, version)
        assert out["event"]["data"] == {"customer_id": "cust-1", "amount_cents": AMOUNT}
    else:
        rejected(out, what, version)
    state = get(orders, f"/aggregates/{oid}").json()["state"]["status"]
    assert state == {"OrderCancelled": "cancelled"}.get(what, state)


def test_rejections_in_the_contract_order(orders: ServiceProcess) -> None:
    o = Orders()
    ghost, oid = o.order(), o.order()
    rejected(post(orders, o.command("PayOrder", ghost, expected_version=3)), "NOT_FOUND", None)
    rejected(post(orders, o.place(ghost, expected_version=1)), "VERSION_CONFLICT", None)
    accepted(post(orders, o.place(oid, expected_version=0)), "OrderPlaced", 1)
    rejected(post(orders, o.place(oid, expected_version=5)), "ALREADY_EXISTS", 1)
    rejected(post(orders, o.command("ShipOrder", oid, expected_version=4)), "VERSION_CONFLICT", 1)
    rejected(post(orders, o.command("ShipOrder", oid, expected_version=1)), "INVALID_TRANSITION", 1)
    # customer_id is read on PlaceOrder only
    accepted(post(orders, o.command("PayOrder", oid, customer_id="someone-else")), "OrderPaid", 2)
    invalid = [
        o.command("PlaceOrder", o.order(), data={"amount_cents": AMOUNT}),  # no customer_id
        o.command("PlaceOrder", o.order(), customer_id="c", data={}),
        o.command("PlaceOrder", o.order(), customer_id="c", data={"amount_cents": 0}),
        o.command("PlaceOrder", o.order(), customer_id="c", data={"amount_cents": True}),
        o.command("PlaceOrder", o.order(), customer_id="c", data={"amount_cents": 9.5}),
        o.command("PlaceOrder", oid, data={"amount_cents": -1}),  # INVALID_COMMAND before ALREADY_EXISTS
    ]
    for command in invalid:
        out = post(orders, command)
        assert (out["status"], out["reason"]) == ("rejected", "INVALID_COMMAND"), out
    assert get(orders, f"/aggregates/{ghost}").status_code == 404


def test_a_command_id_seen_before_is_the_same_outcome_and_no_new_event(orders: ServiceProcess) -> None:
    o = Orders()
    oid = o.order()
    place = o.place(oid)
    first = post(orders, place)
    again = post(orders, place)
    assert first == again
    pay = o.command("PayOrder", oid)
    accepted(post(orders, pay), "OrderPaid", 2)
    stale = o.command("ShipOrder", oid, expected_version=1)
    rejected(post(orders, stale), "VERSION_CONFLICT", 2)
    # sent again after the order moved on: still the same answers
    accepted(post(orders, o.command("ShipOrder", oid)), "OrderShipped", 3)
    assert post(orders, pay)["event"]["version"] == 2
    assert post(orders, stale)["reason"] == "VERSION_CONFLICT"
    events = wait_for(lambda: (e := records(orders, "order-events", oid)) and len(e) >= 3 and e, message="events")
    assert [e["version"] for e in events] == [1, 2, 3]
    assert len(records(orders, "order-rejections", oid)) == 1


def test_get_commands_and_aggregates(orders: ServiceProcess) -> None:
    o = Orders()
    oid = o.order()
    command = o.command("PayOrder", oid)
    post(orders, command)
    resp = get(orders, f"/commands/{command['command_id']}")
    assert resp.status_code == 200
    body = resp.json()
    assert (body["status"], body["reason"], body["aggregate_id"]) == ("rejected", "NOT_FOUND", oid)
    assert get(orders, f"/commands/no-such-{uuid.uuid4().hex}").status_code == 404
    missing = get(orders, f"/aggregates/{oid}")
    assert missing.status_code == 404 and missing.json()["error"]
    assert get(orders, "/accounts/anything").status_code == 404  # the accounts domain's own route is not served


def test_bad_bodies_get_a_4xx(orders: ServiceProcess) -> None:
    for body in (
        {"type": "RefundOrder", "order_id": "o"},
        {"type": "PayOrder"},
        {"type": "PayOrder", "account_id": "a"},
        {"type": "PayOrder", "order_id": "o", "expected_version": "1"},
        {"type": "PayOrder", "order_id": 5},
    ):
        resp = web.post(orders.url + "/commands", json=body, timeout=15)
        assert resp.status_code == 422, (body, resp.text)
        assert resp.json()["error"]


def test_commands_on_the_domain_topic_and_in_batches(orders: ServiceProcess) -> None:
    o = Orders()
    oid, other = o.order(), o.order()
    direct = [o.place(oid), o.command("PayOrder", oid), o.command("RefundOrder", oid)]
    # keyed by another id: the validator moves it to the order's partition first
    produce(topic(orders, "order-commands"), [(oid if n != 1 else "wrong-key", orjson.dumps(c)) for n, c in enumerate(direct)])

    def outcome(command_id: str) -> dict[str, Any] | None:
        resp = get(orders, f"/commands/{command_id}")
        return resp.json() if resp.status_code == 200 and resp.json()["status"] != "pending" else None

    answers = [wait_for(lambda c=c: outcome(c["command_id"]), message="outcome") for c in direct]
    assert [(a["status"], a["reason"]) for a in answers] == [
        ("accepted", None),
        ("accepted", None),
        ("rejected", "INVALID_COMMAND"),
    ]

    batch = {"batch_id": f"batch-{o.run}", "commands": [o.place(other), o.command("ShipOrder", other), o.place(other)]}
    resp = web.post(orders.url + "/commands/batch", json=batch, params={"wait": "true"}, timeout=30)
    assert resp.status_code == 200, resp.text
    items = resp.json()["items"]
    assert [(i["status"], i["reason"], i["version"]) for i in items] == [
        ("accepted", None, 1),
        ("rejected", "INVALID_TRANSITION", None),
        ("rejected", "ALREADY_EXISTS", None),
    ]


def test_openapi_is_the_orders_schema(orders: ServiceProcess) -> None:
    doc = get(orders, "/openapi.json").json()
    schemas = doc["components"]["schemas"]
    command = schemas["OrderCommand"]
    assert set(command["properties"]) == {
        "command_id",
        "type",
        "order_id",
        "customer_id",
        "expected_version",
        "data",
        "issued_at",
    }
    assert set(command["properties"]["type"]["enum"]) == {"PlaceOrder", "PayOrder", "ShipOrder", "CancelOrder"}
    body = doc["paths"]["/commands"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith("/OrderCommand")
    assert "/aggregates/{aggregate_id}" in doc["paths"] and "/accounts/{account_id}" not in doc["paths"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("examples.orders.nope:ORDERS", "'examples.orders.nope' cannot be imported"),
        ("examples.orders.domain:NOPE", "has no attribute 'NOPE'"),
        ("examples.orders.domain:TOPICS", "not a shared.domain.Domain"),
        ("no-colon", "pkg.module:attr"),
    ],
)
def test_a_domain_that_cannot_be_loaded_stops_the_worker_at_start(spec: str, message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "services.validator"],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "STATEFLEET_VALIDATOR_DOMAIN": spec},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert message in proc.stderr and "STATEFLEET_VALIDATOR_DOMAIN" in proc.stderr and "Traceback" not in proc.stderr


def test_fuzzed_requests_get_only_documented_answers(orders: ServiceProcess, tmp_path: Path) -> None:
    """The orders validator's own OpenAPI, fuzzed as every service's is (tests/e2e/test_api_fuzz.py)."""
    run = schemathesis(orders.url, tmp_path)
    report = run.stdout[-12_000:] + run.stderr[-2_000:]
    assert run.returncode == 0 and "Tested:" in run.stdout, report
    assert orders.proc is not None and orders.proc.poll() is None, orders.log_tail()
    o = Orders()
    accepted(post(orders, o.place(o.order())), "OrderPlaced", 1)
