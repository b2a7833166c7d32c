"""The backfill's per-program fold, against a plain-Python model of the contract's tallies."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest

from examples.orders.projection import PROJECTION as ORDERS
from services.tallies.domain import PROJECTION
from spark_jobs.backfill_tallies import PARQUET_COLUMNS, parse_records, parsed_inputs, tallies
from tests.support import orders

pytestmark = pytest.mark.spark

PREFIX = "p."
EVENTS = "p.account-events"
LOGINS = "p.logins"
STATUS = {
    "AccountCreated": "active",
    "AccountDeactivated": "inactive",
    "AccountReactivated": "active",
    "AccountDeleted": "deleted",
}


def history(seed: int) -> list[tuple[str, bytes]]:
    """Account histories with versions 1..n, shuffled, with duplicates, replays and junk."""
    rng = random.Random(seed)
    records: list[tuple[str, bytes]] = []
    for i in range(60):
        program = f"prog-{i % 4}"
        account = f"acct-{i}"
        types = ["AccountCreated"]
        for _ in range(rng.randint(0, 4)):
            last = STATUS.get(types[-1], "active")
            if last == "deleted":
                break
            types.append(
                rng.choice(
                    ["AccountUpdated", "AccountDeleted"]
                    + (["AccountDeactivated"] if last == "active" else ["AccountReactivated"])
                )
            )
        for version, typ in enumerate(types, start=1):
            event = {"type": typ, "account_id": account, "program_id": program, "version": version, "occurred_at": 1}
            records.append((EVENTS, json.dumps(event).encode()))
            if rng.random() < 0.3:
                records.append((EVENTS, json.dumps(event).encode()))  # duplicate delivery
        for _ in range(rng.randint(0, 3)):
            login = {"account_id": account, "program_id": program, "ts": rng.randint(1, 10_000)}
            records.append((LOGINS, json.dumps(login).encode()))
    records += [
        (EVENTS, b"junk"),
        (LOGINS, b'{"account_id":"x","program_id":"prog-9"}'),
        (LOGINS, json.dumps({"account_id": "y", "program_id": "prog-login-only", "ts": 77}).encode()),
    ]
    rng.shuffle(records)
    return records


def model(records: list[tuple[str, bytes]]) -> dict[str, tuple[int, int, int | None]]:
    """The contract, directly: each account counts by the status of its highest version."""
    latest: dict[tuple[str, str], tuple[int, str]] = {}
    status_at: dict[tuple[str, str, int], str] = {}
    last_login: dict[str, int] = {}
    for topic, raw in records:
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if topic == LOGINS:
            if isinstance(obj.get("ts"), int):
                last_login[obj["program_id"]] = max(last_login.get(obj["program_id"], obj["ts"]), obj["ts"])
            continue
        key = (obj["program_id"], obj["account_id"])
        status_at[(*key, obj["version"])] = obj["type"]
        if key not in latest or obj["version"] > latest[key][0]:
            latest[key] = (obj["version"], obj["type"])
    out: dict[str, list[int]] = {}
    for (program, account), (version, _) in latest.items():
        status = "unknown"
        for v in range(1, version + 1):
            status = STATUS.get(status_at[(program, account, v)], status)
        counts = out.setdefault(program, [0, 0])
        counts[0] += status == "active"
        counts[1] += status == "inactive"
    programs = set(out) | set(last_login)
    return {p: (*out.get(p, [0, 0]), last_login.get(p)) for p in programs}  # type: ignore[misc]


def test_parse_records_marks_what_the_service_rejects() -> None:
    frame = pd.DataFrame(
        {
            "topic": [EVENTS, LOGINS, EVENTS],
            "value": [
                b'{"type":"AccountCreated","account_id":"a","program_id":"p","version":1,"occurred_at":3}',
                b'{"account_id":"a","program_id":"p","ts":5}',
                b"[]",
            ],
        }
    )
    (out,) = list(parse_records(PROJECTION, PREFIX)(iter([frame])))
    assert out.astype(object).where(out.notna(), None).values.tolist() == [
        ["change", "p", "a", '"AccountCreated"', 1, None, None],
        ["mark", "p", None, None, None, 5, None],
        ["invalid", None, None, None, None, None, "p.account-events: expected a JSON object, got list"],
    ]


def test_tallies_through_spark_equal_the_model(spark) -> None:  # type: ignore[no-untyped-def]
    records = history(seed=7)
    df = spark.createDataFrame(records, "topic string, value binary").repartition(3)
    got = {
        r["program_id"]: (r["numberActive"], r["numberInactive"], r["lastLogin"])
        for r in tallies(parsed_inputs(df, PROJECTION, PREFIX)).select(*PARQUET_COLUMNS).collect()
    }
    expected = model(records)
    assert got == expected
    assert expected["prog-login-only"] == (0, 0, 77)
    assert "prog-9" not in expected


def test_any_projection_through_spark_equals_its_contract(spark) -> None:  # type: ignore[no-untyped-def]
    """The orders example's projection: rows per customer by the contract (tests/support/orders.py),
    from its events shuffled, with duplicates and junk, folded with the projection's own code."""
    events = orders.history(seed=11, orders=60, customers=5)
    rng = random.Random(3)
    values = [json.dumps(e).encode() for e in events + rng.sample(events, 20)]
    values.append(b'{"type": "OrderShipped", "aggregate_id": "o-x", "version": 2}')  # no data: refused
    rng.shuffle(values)
    df = spark.createDataFrame([("p.order-events", v) for v in values], "topic string, value binary").repartition(3)
    parsed = parsed_inputs(df, ORDERS, PREFIX)
    assert parsed.where("kind = 'invalid'").count() == 1
    rows = tallies(parsed, ORDERS)
    assert rows.columns == ["_key", "_value", "key", "open", "shipped", "cancelled", "revenue_cents"]
    expected = orders.expected_rows(events)
    assert {r["_key"]: json.loads(r["_value"]) for r in rows.collect()} == expected
    assert {r["key"]: r.asDict() for r in rows.drop("_key", "_value").collect()} == expected
