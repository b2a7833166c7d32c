"""The join's Python steps without Spark: account-events read as every reader reads them
(malformed records marked, to be skipped and reported), the earliest login per account in a
micro-batch's join output, any other domain's records read by the join's arguments, and the
arguments themselves."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from shared.projection import InvalidInput
from spark_jobs.activation_join import earliest_logins, parser, read_created, spec_of
from spark_jobs.join_spec import ACCOUNTS, Side, read_record

pytestmark = pytest.mark.spark

T0 = 1_704_067_200_000


def created(account_id: str, **changes: object) -> bytes:
    event = {
        "event_id": "e",
        "command_id": "c",
        "type": "AccountCreated",
        "account_id": account_id,
        "program_id": "p",
        "version": 1,
        "occurred_at": T0,
        "data": {},
        **changes,
    }
    return json.dumps({k: v for k, v in event.items() if v is not None}).encode()


def test_account_events_are_read_as_every_reader_reads_them() -> None:
    values = [
        created("a"),
        created("b", type="AccountUpdated", version=2),  # read, not an AccountCreated: no row
        created("untimed", occurred_at=None),  # breaks the Event shape: skipped
        created("L" * 300),  # breaks the Event shape: skipped
        b"not json",
    ]
    (out,) = list(read_created(iter([pd.DataFrame({"value": values})])))
    rows = out.astype(object).where(out.notna(), None).values.tolist()
    assert rows[0] == ["a", "p", T0, None]
    assert [r[:3] for r in rows[1:]] == [[None, None, None]] * 3
    errors = [r[3] for r in rows[1:]]
    assert "'occurred_at' must be an integer" in errors[0]
    assert "'account_id' is longer than 256 characters" in errors[1]
    assert "JSON" in errors[2]


def test_the_earliest_login_of_a_batch_is_kept_per_account() -> None:
    ts = pd.Timestamp(T0, unit="ms")
    frames = [
        pd.DataFrame(
            {
                "key": ["a", "b", "a"],
                "carry_0": ["p"] * 3,
                "first_at": [T0] * 3,
                "first_ts": [ts] * 3,
                "then_at": [T0 + 50.0, T0 + 7.0, T0 + 9.0],
            }
        ),
        pd.DataFrame(
            {
                "key": ["a", "c", "b"],
                "carry_0": ["p"] * 3,
                "first_at": [T0] * 3,
                "first_ts": [ts] * 3,
                "then_at": [T0 + 3.0, None, T0 + 8.0],
            }
        ),
    ]
    for order in (frames, frames[::-1], [f.iloc[::-1] for f in frames]):
        (out,) = list(earliest_logins(iter(order)))
        got = {a: (None if pd.isna(at) else int(at)) for a, at in zip(out["key"], out["then_at"], strict=True)}
        assert got == {"a": T0 + 3, "b": T0 + 7, "c": None}
    assert list(earliest_logins(iter([]))) == []


ORDERS = [
    "--first-topic",
    "order-events",
    "--first-kind",
    "OrderPlaced",
    "--key",
    "aggregate_id",
    "--then-topic",
    "order-events",
    "--then-kind",
    "OrderShipped",
    "--then-time",
    "occurred_at",
    "--carry",
    "data.customer_id",
    "--key-name",
    "order_id",
    "--first-at-name",
    "placed_at",
    "--then-at-name",
    "shipped_at",
    "--matched-name",
    "shipped",
    "--output-topic",
    "p.order-shipments",
]


def order_event(order_id: object, event_type: str, at: object, **data: object) -> bytes:
    return json.dumps(
        {"event_id": "e", "type": event_type, "aggregate_id": order_id, "version": 1, "occurred_at": at, "data": data}
    ).encode()


def test_the_default_arguments_are_the_activation_join() -> None:
    spec = spec_of(parser().parse_args([]))
    assert spec is ACCOUNTS
    assert spec.output_names == ("account_id", "program_id", "created_at", "first_login_at", "activated")
    assert spec.first == Side("account-events", "account_id", "occurred_at", "AccountCreated")
    assert spec.then == Side("logins", "account_id", "ts", None)
    # Naming the defaults explicitly is still the activation join (its checkpoint and output).
    assert spec_of(parser().parse_args(["--first-topic", "account-events", "--then-key", "account_id"])) is ACCOUNTS


def test_arguments_name_any_join() -> None:
    spec = spec_of(parser().parse_args(ORDERS))
    assert spec.first == Side("order-events", "aggregate_id", "occurred_at", "OrderPlaced")
    assert spec.then == Side("order-events", "aggregate_id", "occurred_at", "OrderShipped")
    assert spec.output_names == ("order_id", "customer_id", "placed_at", "shipped_at", "shipped")
    assert spec.name == "join-p.order-shipments" and spec.default_output is None
    with pytest.raises(ValueError, match="--output-topic is required"):
        spec_of(parser().parse_args(ORDERS[:-2]))
    with pytest.raises(ValueError, match="different names"):
        spec_of(parser().parse_args([*ORDERS, "--matched-name", "order_id"]))
    with pytest.raises(ValueError, match="not a field name"):
        spec_of(parser().parse_args([*ORDERS, "--carry", "data."]))


def test_records_of_any_domain_are_read_by_the_arguments() -> None:
    spec = spec_of(parser().parse_args(ORDERS))
    placed = order_event("o1", "OrderPlaced", T0, customer_id="c1", amount_cents=5)
    assert read_record(spec.first, placed, spec.kind_field, spec.carry) == ("o1", ("c1",), T0)
    # A record of the other kind is not an A record: no row, no error.
    assert read_record(spec.first, order_event("o1", "OrderShipped", T0 + 1), spec.kind_field, spec.carry) is None
    assert read_record(spec.then, order_event("o1", "OrderShipped", T0 + 1), spec.kind_field) == ("o1", (), T0 + 1)
    # A carried field that is missing is null; one that is not a string is written as JSON.
    assert read_record(spec.first, order_event("o2", "OrderPlaced", T0), spec.kind_field, spec.carry) == ("o2", (None,), T0)
    assert read_record(spec.first, order_event("o3", "OrderPlaced", T0, customer_id=7), spec.kind_field, spec.carry) == (
        "o3",
        ("7",),
        T0,
    )
    with pytest.raises(InvalidInput, match="'aggregate_id' must be a non-empty string"):
        read_record(spec.first, order_event(None, "OrderPlaced", T0), spec.kind_field)
    with pytest.raises(InvalidInput, match="'occurred_at' must be an integer"):
        read_record(spec.first, order_event("o1", "OrderPlaced", True), spec.kind_field)


def test_the_pandas_step_reads_a_side_of_any_domain() -> None:
    spec = spec_of(parser().parse_args(ORDERS))
    values = [
        order_event("o1", "OrderPlaced", T0, customer_id="c1"),
        order_event("o1", "OrderPaid", T0 + 1, customer_id="c1"),
        order_event("o2", "OrderPlaced", "noon"),
    ]
    (out,) = list(read_created(iter([pd.DataFrame({"value": values})]), spec))
    rows = out.astype(object).where(out.notna(), None).values.tolist()
    assert rows == [["o1", "c1", T0, None], [None, None, None, "'occurred_at' must be an integer, got 'noon'"]]
