"""The orders projection: its reader, its rules, and rows that no replay, duplicate or
re-ordering by version changes (folded as the service applies them, and on the service's
topology with the in-memory driver)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples.orders.projection import PROJECTION, contribution, read_order_event
from services.tallies.app import TalliesService
from services.tallies.handlers.by_program import ByProgram
from shared.engine.testing import TopologyDriver
from shared.projection import Change, InvalidInput, fold
from shared.settings import Settings
from tests.support.orders import expected_rows, history, order_event

PARTITIONS = 4


def folded_rows(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    changes: dict[str, list[Change]] = {}
    for e in events:
        change = read_order_event(e)
        changes.setdefault(change.category, []).append(change)
    rows = {}
    for customer, items in changes.items():
        totals, mark = fold(PROJECTION, items, [])
        rows[customer] = PROJECTION.row(customer, totals, mark)
    return rows


def test_reader_reads_the_order_its_customer_and_its_standing() -> None:
    change = read_order_event(order_event("o1", "c1", "OrderShipped", 3, amount=2500))
    assert change == Change("o1", "c1", "shipped:2500", 3)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"type": "OrderLost"}, "unknown order event type"),
        ({"type": ["OrderPlaced"]}, "unknown order event type"),
        ({"version": 0}, "'version' must be >= 1"),
        ({"version": True}, "'version' must be an integer"),
        ({"aggregate_id": ""}, "'aggregate_id' must be a non-empty string"),
        ({"aggregate_id": "o\x00"}, "must not contain NUL"),
        ({"data": None}, "'data' must be an object"),
        ({"data": {"amount_cents": 5}}, "'customer_id' must be a non-empty string"),
        ({"data": {"customer_id": "c", "amount_cents": "5"}}, "'amount_cents' must be an integer"),
        ({"data": {"customer_id": "c", "amount_cents": False}}, "'amount_cents' must be an integer"),
    ],
)
def test_reader_refuses_records_that_break_the_event_shape(patch: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        read_order_event({**order_event("o1", "c1", "OrderPlaced", 1), **patch})


@pytest.mark.parametrize(
    ("standing", "counted"),
    [("placed:10", (1, 0, 0, 0)), ("paid:10", (1, 0, 0, 0)), ("shipped:10", (0, 1, 0, 10)), ("cancelled:10", (0, 0, 1, 0))],
)
def test_each_status_counts_where_the_contract_says(standing: str, counted: tuple[int, ...]) -> None:
    assert contribution(standing) == counted


def test_rows_follow_each_orders_latest_status() -> None:
    events = [
        *(order_event("o1", "c1", t, v, 100) for v, t in enumerate(["OrderPlaced", "OrderPaid", "OrderShipped"], 1)),
        *(order_event("o2", "c1", t, v, 200) for v, t in enumerate(["OrderPlaced", "OrderPaid", "OrderShipped"], 1)),
        *(order_event("o3", "c1", t, v, 400) for v, t in enumerate(["OrderPlaced", "OrderCancelled"], 1)),
        order_event("o4", "c1", "OrderPlaced", 1, 800),
        *(order_event("o5", "c2", t, v, 50) for v, t in enumerate(["OrderPlaced", "OrderPaid"], 1)),
    ]
    assert folded_rows(events) == {
        "c1": {"key": "c1", "open": 1, "shipped": 2, "cancelled": 1, "revenue_cents": 300},
        "c2": {"key": "c2", "open": 1, "shipped": 0, "cancelled": 0, "revenue_cents": 0},
    }


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.randoms(use_true_random=False))
def test_replays_duplicates_and_reordering_never_change_the_rows(seed: int, rng: random.Random) -> None:
    events = history(seed)
    noisy = events + rng.choices(events, k=len(events) // 2)  # duplicates and replays
    rng.shuffle(noisy)  # any order, versions included
    assert folded_rows(noisy) == folded_rows(events) == expected_rows(events)


# -- on the service's topology (in memory, no broker) ---------------------------------------------


@pytest.fixture(params=["at_least_once", "exactly_once"])
def orders(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[TalliesService, TopologyDriver]]:
    service = TalliesService(
        Settings(data_dir=tmp_path, topic_partitions=PARTITIONS, processing_guarantee=request.param, topic_prefix="x."),
        PROJECTION,
    )
    with TopologyDriver(service.engine) as driver:
        yield service, driver


@pytest.fixture(autouse=True)
def owns_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ByProgram, "owned_partitions", lambda self: set(range(PARTITIONS)))


def published(service: TalliesService, driver: TopologyDriver) -> dict[str, dict[str, Any]]:
    latest: dict[str, dict[str, Any]] = {}
    for r in driver.outputs(service.output_topic):
        assert r.key is not None and r.value is not None
        latest[r.key.decode()] = orjson.loads(r.value)
    return latest


def test_the_service_runs_the_projection_on_its_own_topics_and_state(orders: tuple[TalliesService, TopologyDriver]) -> None:
    service, _ = orders
    assert service.input_topics == ["x.order-events"]
    assert service.output_topic == "x.order-tallies"
    assert service.name == "tallies-orders"
    assert service.retry_topic_name == "x.retry-tallies-orders"
    assert service.by_program_topic_name == "x.statefleet-tallies-orders-by-program"


def test_the_service_applies_replays_once_and_publishes_the_rows(orders: tuple[TalliesService, TopologyDriver]) -> None:
    service, driver = orders
    events = history(11, orders=30, customers=5)
    replayed = events + events[::3]
    random.Random(5).shuffle(replayed)
    for e in replayed:
        driver.send(service.input_topics[0], e["aggregate_id"].encode(), orjson.dumps(e))
    driver.send(service.input_topics[0], b"bad", b'{"type": "OrderPlaced"}')
    driver.process()
    driver.run(service.by_program.send_publish_ticks())
    driver.process()
    expected = expected_rows(events)
    assert {key: service.by_program.tally(key) for key in expected} == expected
    assert published(service, driver) == expected
    assert len(driver.outputs(service.topics.dead_letters)) == 1
