"""The domain API itself: loading a domain by name with a clear error for each way it can be
wrong, the completeness check, reading events back, and the generic envelope."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from examples.orders.domain import ORDERS
from services.validator.domain import ACCOUNTS
from shared import domain as api
from shared.domain import DomainError, InvalidDomainEvent, check_domain, load_domain, read_event


def make_orders() -> api.Domain[Any]:
    return ORDERS


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("examples.orders.domain", "must be given as 'pkg.module:attr'"),
        (":ORDERS", "must be given as 'pkg.module:attr'"),
        ("examples.orders.nope:ORDERS", "domain module 'examples.orders.nope' cannot be imported: ModuleNotFoundError"),
        ("examples.orders.domain:NOPE", "domain module 'examples.orders.domain' has no attribute 'NOPE'"),
        ("examples.orders.domain:TOPICS", "examples.orders.domain:TOPICS is a DomainTopics, not a shared.domain.Domain"),
        ("examples.orders.domain:amount_problem", "raised TypeError"),
    ],
)
def test_load_domain_names_the_module_and_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(DomainError) as raised:
        load_domain(spec)
    assert message in str(raised.value)


def test_load_domain_takes_a_domain_or_a_function_returning_one() -> None:
    assert load_domain("examples.orders.domain:ORDERS") is ORDERS
    assert load_domain("tests.unit.shared.test_domain:make_orders") is ORDERS
    assert load_domain("services.validator.domain:ACCOUNTS") is ACCOUNTS


@pytest.mark.parametrize(
    ("change", "missing"),
    [
        ({"decide": None}, "decide (a function)"),
        ({"evolve": "evolve"}, "evolve (a function)"),
        ({"guard": 3}, "guard (a function or None)"),
        ({"command_model": dict}, "command_model (a pydantic model)"),
        ({"aggregate_id_field": "basket_id"}, "command_model fields basket_id"),
        ({"command_types": ()}, "command_types (at least one)"),
        ({"creates": frozenset({"Nope"})}, "creates (one or more of command_types)"),
        ({"event_types": frozenset()}, "event_types (at least one)"),
        ({"topics": api.DomainTopics("c", "", "r", "b")}, "topics.events"),
        ({"noun": ""}, "noun"),
        ({"noun": 5}, "noun (a non-empty string)"),
        ({"aggregate_id_field": None}, "aggregate_id_field (a non-empty string)"),
        ({"command_fields": None}, "command_fields (a tuple of field names)"),
        ({"command_fields": "customer_id"}, "command_fields (a tuple of field names)"),
        ({"command_types": "PlaceOrder"}, "command_types (at least one)"),
        ({"command_types": ("PlaceOrder", 3)}, "command_types (at least one)"),
        ({"creates": "PlaceOrder"}, "creates (one or more of command_types)"),
        ({"event_types": "OrderPlaced"}, "event_types (at least one)"),
        ({"reasons": None}, "reasons (a tuple of rejection reasons)"),
        ({"topics": {"commands": "c"}}, "topics.commands; topics.events; topics.rejections; topics.command_batches"),
    ],
)
def test_an_incomplete_domain_is_refused(change: dict[str, Any], missing: str) -> None:
    broken = dataclasses.replace(ORDERS, **change)
    with pytest.raises(DomainError) as raised:
        check_domain(broken, "team.domain:BROKEN")
    assert str(raised.value).startswith("team.domain:BROKEN lacks part of the domain API: ") and missing in str(raised.value)


def test_the_names_may_come_in_any_collection() -> None:
    listed = dataclasses.replace(ORDERS, creates=["PlaceOrder"], event_types={"OrderPlaced", "OrderPaid"})  # type: ignore[arg-type]
    assert check_domain(listed, "team.domain:LISTED") is listed


def test_a_malformed_record_cannot_be_answered() -> None:
    for obj in ({"type": "PayOrder", "order_id": "o"}, {"command_id": "c", "type": "PayOrder", "order_id": ""}):
        with pytest.raises(api.MalformedCommand):
            api.parse_command(ORDERS, obj, default_issued_at=0)


def test_read_event_checks_the_shape() -> None:
    good: dict[str, Any] = {
        "event_id": "e",
        "command_id": "c",
        "type": "OrderPaid",
        "aggregate_id": "o",
        "version": 2,
        "occurred_at": 5,
        "data": {"customer_id": "k", "amount_cents": 3},
    }
    assert read_event(ORDERS, good) == api.Event("e", "c", "OrderPaid", "o", 2, 5, good["data"], {})
    cases: list[tuple[dict[str, Any], str]] = [
        ({"type": "AccountCreated"}, "unknown event type"),
        ({"version": 0}, "'version'"),
        ({"version": True}, "'version'"),
        ({"aggregate_id": ""}, "'aggregate_id'"),
        ({"occurred_at": "5"}, "'occurred_at'"),
        ({"data": []}, "'data'"),
    ]
    for bad, problem in cases:
        with pytest.raises(InvalidDomainEvent, match=problem):
            read_event(ORDERS, {**good, **bad})
    # the accounts events' own top-level fields are kept
    account_event = {**good, "type": "AccountCreated", "account_id": "a", "program_id": "p"}
    del account_event["aggregate_id"]
    assert read_event(ACCOUNTS, account_event).fields == {"program_id": "p"}


def test_event_ids_are_the_same_for_the_same_command_only() -> None:
    assert api.event_id_for("o", "c") == api.event_id_for("o", "c")
    assert len({api.event_id_for("o", "c"), api.event_id_for("o", "d"), api.event_id_for("p", "c")}) == 3
