"""The backfill reads tally inputs exactly as the tallies service does."""

from __future__ import annotations

import json
from typing import Any

import pytest

from examples.orders.projection import PROJECTION as ORDERS
from services.tallies.domain import PROJECTION, InvalidInput
from services.tallies.handlers.inputs import parse_input as service_parse_input
from shared import codecs
from shared.projection import Change, Mark
from shared.topics import TopicNames
from spark_jobs.tally_input import read_input

CHANGE = "change"
LOGIN = "login"

pytestmark = pytest.mark.spark

TOPICS = TopicNames("p.")
EVENT = b'{"type":"AccountCreated","account_id":"a","program_id":"p1","version":1,"occurred_at":5}'
CASES = [
    (CHANGE, EVENT),
    (CHANGE, b'{"type":"AccountUpdated","account_id":"a","program_id":"p1","version":2,"occurred_at":6}'),
    (CHANGE, b'{"type":"AccountDeleted","account_id":"a","program_id":"p1","version":7,"occurred_at":7,"extra":1}'),
    (CHANGE, b'{"type":"AccountUpdated","account_id":"a","program_id":"p1","version":2}'),
    (CHANGE, b'{"type":"AccountDeleted","account_id":"a","program_id":"p1","version":7,"extra":1}'),
    (CHANGE, b'{"type":"AccountCreated","account_id":"' + b"a" * 300 + b'","program_id":"p1","version":1,"occurred_at":5}'),
    (CHANGE, b'{"type":["AccountCreated"],"account_id":"a","program_id":"p1","version":1,"occurred_at":5}'),
    (CHANGE, b'{"type":"Nope","account_id":"a","program_id":"p1","version":1}'),
    (CHANGE, b'{"type":"AccountCreated","account_id":"a","program_id":"p1","version":0}'),
    (CHANGE, b'{"type":"AccountCreated","account_id":"a","program_id":"p1","version":true}'),
    (CHANGE, b'{"type":"AccountCreated","account_id":"","program_id":"p1","version":1}'),
    (CHANGE, b'{"type":"AccountCreated","account_id":"a","program_id":"p\\u0000x","version":1}'),
    (CHANGE, b'{"type":"AccountCreated","account_id":"a","program_id":"p\\u0000x","version":1,"occurred_at":5}'),
    (LOGIN, b'{"account_id":"a","program_id":"p\\u0000x","ts":10}'),
    (CHANGE, b"[1,2]"),
    (CHANGE, b"not json"),
    (CHANGE, None),
    (LOGIN, b'{"account_id":"a","program_id":"p1","ts":10}'),
    (LOGIN, b'{"account_id":"a","program_id":"p1","ts":"10"}'),
    (LOGIN, b'{"account_id":"a","ts":10}'),
]


def outcome(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except (codecs.DecodeError, InvalidInput) as exc:
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize(("kind", "value"), CASES)
def test_same_outcome_as_the_service(kind: str, value: bytes | None) -> None:
    topic = TOPICS.account_events if kind == CHANGE else TOPICS.logins
    assert outcome(read_input, PROJECTION, topic, value, TOPICS.prefix) == outcome(
        service_parse_input, topic, value, None, TOPICS
    )


def order(**changes: object) -> bytes:
    event = {"type": "OrderPlaced", "aggregate_id": "o1", "version": 1, "data": {"customer_id": "c1", "amount_cents": 5}}
    return json.dumps({**event, **changes}).encode()


ORDER_CASES = [
    order(),
    order(type="OrderShipped", version=3),
    order(type="OrderLost"),
    order(version=0),
    order(data={"customer_id": "c1", "amount_cents": True}),
    order(data=[]),
    b"not json",
]


@pytest.mark.parametrize("value", ORDER_CASES)
def test_same_outcome_as_the_service_for_any_projection(value: bytes) -> None:
    topic = TOPICS.name("order-events")
    assert outcome(read_input, ORDERS, topic, value, TOPICS.prefix) == outcome(
        service_parse_input, topic, value, None, TOPICS, projection=ORDERS
    )


def test_values() -> None:
    assert read_input(PROJECTION, TOPICS.account_events, EVENT, TOPICS.prefix) == Change("a", "p1", "AccountCreated", 1)
    assert read_input(PROJECTION, TOPICS.logins, b'{"account_id":"a","program_id":"p1","ts":10}', "p.") == Mark("p1", 10)
    assert read_input(ORDERS, "p.order-events", order(), "p.") == Change("o1", "c1", "placed:5", 1)
    with pytest.raises(InvalidInput, match=r"cannot tell what a record from topic 'p\.order-events' is"):
        read_input(PROJECTION, "p.order-events", order(), "p.")
