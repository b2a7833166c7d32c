"""The backfill reads tally inputs exactly as the tallies service does."""

from __future__ import annotations

from typing import Any

import pytest

from services.tallies.app import parse_input as service_parse_input
from services.tallies.domain import InvalidInput, Login
from shared import codecs
from shared.accounts import AccountChange
from shared.projection import Change, Mark
from shared.topics import TopicNames
from spark_jobs.tally_input import CHANGE, LOGIN, parse_input

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


def outcome(fn: Any, *args: Any) -> Any:
    try:
        return as_projection_input(fn(*args))
    except (codecs.DecodeError, InvalidInput) as exc:
        return type(exc).__name__, str(exc)


def as_projection_input(item: Any) -> Any:
    """The backfill's AccountChange or Login as the service's projection reads it (Change, Mark)."""
    if isinstance(item, AccountChange):
        return Change(*item[:4])
    if isinstance(item, Login):
        return Mark(item.program_id, item.ts)
    return item


@pytest.mark.parametrize(("kind", "value"), CASES)
def test_same_outcome_as_the_service(kind: str, value: bytes | None) -> None:
    topic = TOPICS.account_events if kind == CHANGE else TOPICS.logins
    assert outcome(parse_input, kind, value) == outcome(service_parse_input, topic, value, None, TOPICS)


def test_values() -> None:
    assert parse_input(CHANGE, EVENT) == AccountChange("a", "p1", "AccountCreated", 1)
    assert parse_input(LOGIN, b'{"account_id":"a","program_id":"p1","ts":10}') == Login("a", "p1", 10)
