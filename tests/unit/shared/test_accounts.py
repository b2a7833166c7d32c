"""The one reading of an ``account-events`` record (``shared.accounts.parse_event``), and that
every reader of the topic gives the same verdict with it: the validator's projection (and its
redeliveries), the tallies, the Spark backfill's input and the activation join."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from services.retry_scheduler.domain import Park, build_policy_book, decide
from services.tallies.domain import InvalidInput, parse_account_change
from services.tallies.handlers.inputs import parse_input as tallies_parse_input
from shared import codecs
from shared.accounts import MAX_ID_LENGTH, AccountChange, InvalidEvent, parse_event
from shared.topics import TopicNames

EVENT: dict[str, Any] = {
    "event_id": "e",
    "command_id": "c",
    "type": "AccountCreated",
    "account_id": "a",
    "program_id": "p",
    "version": 1,
    "occurred_at": 5,
    "data": {},
}
#: AccountCreated events that break the contract's Event shape, by the field named in the
#: refusal: each is refused by every reader.
MALFORMED: dict[str, tuple[str, dict[str, Any]]] = {
    "no occurred_at": ("occurred_at", {k: v for k, v in EVENT.items() if k != "occurred_at"}),
    "300-character account_id": ("account_id", {**EVENT, "account_id": "x" * 300}),
    "occurred_at as text": ("occurred_at", {**EVENT, "occurred_at": "5"}),
    "occurred_at true": ("occurred_at", {**EVENT, "occurred_at": True}),
    "NUL in account_id": ("account_id", {**EVENT, "account_id": "a\x00b"}),
    "NUL in program_id": ("program_id", {**EVENT, "program_id": "p\x00q"}),
    "300-character program_id": ("program_id", {**EVENT, "program_id": "p" * 300}),
    "type a list": ("type", {**EVENT, "type": ["AccountCreated"]}),
    "type an object": ("type", {**EVENT, "type": {"a": 1}}),
}


def test_parse_account_event() -> None:
    ev = EVENT
    assert parse_event(ev) == AccountChange("a", "p", "AccountCreated", 1, 5)
    for bad in ({"type": "Nope"}, {"version": 0}, {"version": "1"}, {"occurred_at": None}, {"program_id": ""}):
        with pytest.raises(InvalidEvent):
            parse_event({**ev, **bad})


def test_ids_up_to_the_limit_are_read() -> None:
    longest = "x" * MAX_ID_LENGTH
    assert parse_event({**EVENT, "account_id": longest, "program_id": longest}).account_id == longest


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_event_is_refused_naming_the_field(name: str) -> None:
    field, record = MALFORMED[name]
    with pytest.raises(InvalidEvent) as refused:
        parse_event(record)
    assert field in str(refused.value)


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_every_reader_refuses_a_malformed_event(name: str) -> None:
    """The validator's readers use parse_event itself; the tallies (and the backfill, which
    reads as they do) refuse the same record with their own error class."""
    value = orjson.dumps(MALFORMED[name][1])
    with pytest.raises(InvalidEvent):
        parse_event(codecs.loads_object(value))
    with pytest.raises(InvalidInput):
        parse_account_change(codecs.loads_object(value))
    topics = TopicNames("p.")
    with pytest.raises(InvalidInput):
        tallies_parse_input(topics.account_events, value, None, topics)


def test_a_well_formed_event_is_read_alike_by_every_reader() -> None:
    value = orjson.dumps(EVENT)
    change = parse_event(codecs.loads_object(value))
    # the tallies keep everything but the time, which no tally depends on
    assert parse_account_change(codecs.loads_object(value)) == change._replace(occurred_at=None)


@pytest.mark.parametrize("error_class", [InvalidEvent.__name__, InvalidInput.__name__])
def test_the_retry_scheduler_parks_a_malformed_event_at_once(error_class: str) -> None:
    book = build_policy_book(max_attempts=5, base_delay_ms=1000, max_delay_ms=60_000, jitter="equal", overrides="")
    fate = decide(
        book,
        dlq_id="d",
        attempt=1,
        origin_topic="account-events",
        error_class=error_class,
        failed_at=0,
        retry_topic="retry-validator",
        now_ms=0,
    )
    assert isinstance(fate, Park) and fate.policy.max_attempts == 1
