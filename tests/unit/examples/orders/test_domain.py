"""The orders example domain through the validator's domain API, without Kafka: every row of
the rules table, the check order, the rejection reasons, the event and rejection records, and
properties of any sequence of commands (versions without gaps, idempotent command ids)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples.orders.domain import ORDERS, Order, OrderCommand
from shared import domain as api
from shared.domain import Accepted, Aggregate, Command, Duplicate, Outcome, OutcomeCode, Rejected, Row, check_domain

PLACED_AMOUNT = 1250


def parse(obj: dict[str, Any]) -> Command:
    return api.parse_command(ORDERS, {"command_id": "c", "order_id": "o1", **obj}, default_issued_at=7)


def decide(current: Aggregate[Order] | None, command: Command, seen: dict[str, OutcomeCode] | None = None) -> Outcome:
    return api.decide(ORDERS, current, seen or {}, command)


def order(status: str, version: int = 2) -> Aggregate[Order]:
    return Aggregate("o1", version, Order(status=status, customer_id="k1", amount_cents=PLACED_AMOUNT))


def place(**extra: Any) -> Command:
    return parse({"type": "PlaceOrder", "customer_id": "k1", "data": {"amount_cents": PLACED_AMOUNT}, **extra})


def reason(outcome: Outcome) -> str:
    assert isinstance(outcome, Rejected), outcome
    return outcome.rejection.reason


def test_the_domain_is_complete() -> None:
    assert check_domain(ORDERS, "examples.orders.domain:ORDERS") is ORDERS
    assert api.load_domain("examples.orders.domain:ORDERS") is ORDERS
    assert ORDERS.topics == api.DomainTopics("order-commands", "order-events", "order-rejections", "order-command-batches")


def test_place_order_is_version_1_placed_with_the_customer_and_amount() -> None:
    outcome = decide(None, place(issued_at=99))
    assert isinstance(outcome, Accepted)
    assert ORDERS.event_json(outcome.event) == {
        "event_id": api.event_id_for("o1", "c"),
        "command_id": "c",
        "type": "OrderPlaced",
        "aggregate_id": "o1",
        "version": 1,
        "occurred_at": 99,
        "data": {"customer_id": "k1", "amount_cents": PLACED_AMOUNT},
    }
    assert ORDERS.aggregate_json(outcome.aggregate) == {
        "aggregate_id": "o1",
        "version": 1,
        "state": {"status": "placed", "customer_id": "k1", "amount_cents": PLACED_AMOUNT},
    }


RULES: list[tuple[str, str, str | None]] = [
    # command, status before, status after (None: INVALID_TRANSITION)
    ("PayOrder", "placed", "paid"),
    ("PayOrder", "paid", None),
    ("PayOrder", "shipped", None),
    ("PayOrder", "cancelled", None),
    ("ShipOrder", "placed", None),
    ("ShipOrder", "paid", "shipped"),
    ("ShipOrder", "shipped", None),
    ("ShipOrder", "cancelled", None),
    ("CancelOrder", "placed", "cancelled"),
    ("CancelOrder", "paid", "cancelled"),
    ("CancelOrder", "shipped", None),
    ("CancelOrder", "cancelled", None),
]
EVENT_OF = {"PayOrder": "OrderPaid", "ShipOrder": "OrderShipped", "CancelOrder": "OrderCancelled"}


@pytest.mark.parametrize(("command_type", "before", "after"), RULES)
def test_rules_table(command_type: str, before: str, after: str | None) -> None:
    outcome = decide(order(before, version=4), parse({"type": command_type}))
    if after is None:
        assert reason(outcome) == "INVALID_TRANSITION"
        assert isinstance(outcome, Rejected) and outcome.rejection.current_version == 4
        return
    assert isinstance(outcome, Accepted)
    assert (outcome.event.type, outcome.event.version, outcome.aggregate.state.status) == (EVENT_OF[command_type], 5, after)
    # every event carries the order's customer and amount as placed
    assert outcome.event.data == {"customer_id": "k1", "amount_cents": PLACED_AMOUNT}


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        ({"type": "RefundOrder"}, "unknown command type"),
        ({"type": "PlaceOrder", "data": {"amount_cents": 5}}, "customer_id"),
        ({"type": "PlaceOrder", "customer_id": "k", "data": {}}, "amount_cents"),
        ({"type": "PlaceOrder", "customer_id": "k", "data": {"amount_cents": 0}}, "amount_cents"),
        ({"type": "PlaceOrder", "customer_id": "k", "data": {"amount_cents": -3}}, "amount_cents"),
        ({"type": "PlaceOrder", "customer_id": "k", "data": {"amount_cents": True}}, "amount_cents"),
        ({"type": "PlaceOrder", "customer_id": "k", "data": {"amount_cents": 2.5}}, "amount_cents"),
        ({"type": "PlaceOrder", "customer_id": "k", "data": {"amount_cents": "5"}}, "amount_cents"),
        ({"type": "PlaceOrder", "customer_id": 5, "data": {"amount_cents": 5}}, "customer_id"),
        ({"type": "PayOrder", "expected_version": "1"}, "expected_version"),
        ({"type": "PayOrder", "data": []}, "data"),
    ],
)
def test_invalid_commands(obj: dict[str, Any], fragment: str) -> None:
    rejection = decide(None, parse(obj))
    assert reason(rejection) == "INVALID_COMMAND"
    assert isinstance(rejection, Rejected) and fragment in rejection.rejection.detail
    # INVALID_COMMAND comes before every other check
    assert reason(decide(order("shipped"), parse(obj))) == "INVALID_COMMAND"


def test_customer_id_is_read_on_place_order_only() -> None:
    outcome = decide(order("placed"), parse({"type": "PayOrder", "customer_id": "someone-else"}))
    assert isinstance(outcome, Accepted) and outcome.event.data["customer_id"] == "k1"


def test_check_order() -> None:
    # PlaceOrder: ALREADY_EXISTS, then VERSION_CONFLICT unless expected_version is null or 0
    assert reason(decide(order("cancelled"), place(expected_version=9))) == "ALREADY_EXISTS"
    assert reason(decide(None, place(expected_version=1))) == "VERSION_CONFLICT"
    assert isinstance(decide(None, place(expected_version=0)), Accepted)
    # the others: NOT_FOUND, then VERSION_CONFLICT, then INVALID_TRANSITION
    assert reason(decide(None, parse({"type": "ShipOrder", "expected_version": 9}))) == "NOT_FOUND"
    assert reason(decide(order("placed", 2), parse({"type": "ShipOrder", "expected_version": 1}))) == "VERSION_CONFLICT"
    assert reason(decide(order("placed", 2), parse({"type": "ShipOrder", "expected_version": 2}))) == "INVALID_TRANSITION"
    assert isinstance(decide(order("placed", 2), parse({"type": "PayOrder", "expected_version": 2})), Accepted)


def test_a_seen_command_id_is_the_same_outcome_and_no_event() -> None:
    assert decide(order("paid"), parse({"type": "PayOrder"}), seen={"c": 2}) == Duplicate("c", "o1", 2)
    assert decide(None, parse({"type": "RefundOrder"}), seen={"c": "NOT_FOUND"}) == Duplicate("c", "o1", "NOT_FOUND")


def test_rejection_record() -> None:
    outcome = decide(None, parse({"type": "PayOrder"}))
    assert isinstance(outcome, Rejected)
    assert ORDERS.rejection_json(outcome.rejection) == {
        "command_id": "c",
        "aggregate_id": "o1",
        "reason": "NOT_FOUND",
        "detail": "order 'o1' does not exist",
        "current_version": None,
    }


def test_events_read_back_and_state_round_trips() -> None:
    outcome = decide(None, place())
    assert isinstance(outcome, Accepted)
    assert api.read_event(ORDERS, ORDERS.event_json(outcome.event)) == outcome.event
    state = outcome.aggregate.state
    assert ORDERS.state_from_json(ORDERS.state_to_json(state)) == state


def test_http_schema() -> None:
    ok = OrderCommand.model_validate({"type": "PlaceOrder", "order_id": "o1", "customer_id": "k"})
    assert ok.command_id is None and ok.data == {}
    for bad in ({"type": "RefundOrder", "order_id": "o1"}, {"type": "PayOrder"}, {"type": "PayOrder", "order_id": "o\x00"}):
        with pytest.raises(ValueError):
            OrderCommand.model_validate(bad)


# -- properties of any sequence of commands ----------------------------------------------------

TYPES = st.sampled_from(["PlaceOrder", "PayOrder", "ShipOrder", "CancelOrder"])
COMMANDS = st.lists(
    st.tuples(TYPES, st.sampled_from(["o1", "o2"]), st.integers(0, 12), st.one_of(st.none(), st.integers(0, 4))), max_size=30
)
#: The rules table as a reference: (command, status before) → status after.
NEXT = {(t, b): a for t, b, a in RULES if a is not None}


@settings(max_examples=200, deadline=None)
@given(COMMANDS)
def test_any_sequence_keeps_versions_without_gaps_and_follows_the_table(commands: list[tuple[str, str, int, int | None]]) -> None:
    cmds = [
        api.parse_command(
            ORDERS,
            {
                "command_id": f"c{n}",
                "type": t,
                "order_id": oid,
                "customer_id": "k",
                "expected_version": ev,
                "data": {"amount_cents": 100},
            },
            default_issued_at=0,
        )
        for t, oid, n, ev in commands
    ]
    rows: dict[str, Row[Order]] = {}
    plan = api.plan_batch(ORDERS, cmds, rows.get, history_limit=1000)
    versions: dict[str, int] = {}
    status: dict[str, str] = {}
    answers: dict[tuple[str, str], OutcomeCode] = {}
    for command, outcome in zip(cmds, plan.outcomes, strict=True):
        key = (command.aggregate_id, command.command_id)
        if key in answers:
            assert isinstance(outcome, Duplicate) and outcome.original == answers[key]
            continue
        current = status.get(command.aggregate_id)
        if isinstance(outcome, Accepted):
            versions[command.aggregate_id] = versions.get(command.aggregate_id, 0) + 1
            assert outcome.event.version == versions[command.aggregate_id]
            expected = "placed" if command.type == "PlaceOrder" else NEXT[(command.type, current or "")]
            status[command.aggregate_id] = expected
            assert outcome.aggregate.state.status == expected
            answers[key] = outcome.event.version
        else:
            assert isinstance(outcome, Rejected)
            answers[key] = outcome.rejection.reason
            version = versions.get(command.aggregate_id, 0)
            if command.type == "PlaceOrder":
                assert outcome.rejection.reason == ("ALREADY_EXISTS" if current else "VERSION_CONFLICT")
            elif current is None:
                assert outcome.rejection.reason == "NOT_FOUND"
            elif command.expected_version is not None and command.expected_version != version:
                assert outcome.rejection.reason == "VERSION_CONFLICT"
            else:
                assert outcome.rejection.reason == "INVALID_TRANSITION"
                assert (command.type, current) not in NEXT
    for oid, version in versions.items():
        row = plan.states[oid]
        assert row.aggregate is not None and row.aggregate.version == version
