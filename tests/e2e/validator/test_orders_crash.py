"""The validator running the orders domain, SIGKILLed mid-stream twice (once keeping its
local state, once losing it), under both processing guarantees. Afterwards every order has
exactly one event per version (OrderPlaced 1, OrderPaid 2, OrderShipped 3, each carrying the
order's customer and amount) and one INVALID_TRANSITION rejection: once replays are dropped
by event_id with at_least_once, and with no repeated record at all read_committed with
exactly_once."""

from __future__ import annotations

import shutil
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest

from shared.engine import partition_for
from tests.e2e.validator.test_validator_crash import COMMAND_PARTITIONS, RecordCount, feed_in_background
from tests.support.kafka import produce, read_all
from tests.support.services import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DOMAIN = "examples.orders.domain:ORDERS"
ORDERS = 300
#: Each order's commands in order: three accepted, a cancel of the shipped order (rejected),
#: and the payment sent again (a duplicate: no new event, no new rejection).
STEPS = ("PlaceOrder", "PayOrder", "ShipOrder", "CancelOrder", "PayOrder")
EVENTS = ("OrderPlaced", "OrderPaid", "OrderShipped")
MARKER = "end-marker-"


def amount(i: int) -> int:
    return 100 + i


def command(i: int, step: int) -> tuple[str, bytes]:
    oid = f"crash-order-{i}"
    n = 1 if step == 4 else step  # the duplicate carries the payment's command id
    body: dict[str, Any] = {"command_id": f"{oid}-{n}", "type": STEPS[step], "order_id": oid, "issued_at": 1_700_000_000_000 + n}
    if step == 0:
        body |= {"customer_id": f"cust-{i % 7}", "data": {"amount_cents": amount(i)}}
    elif i % 2 == 0:
        body["expected_version"] = n
    return oid, orjson.dumps(body)


def end_markers(commands_topic: str) -> set[str]:
    """A PlaceOrder of a new order on each partition, behind every command sent so far."""
    markers: dict[int, str] = {}
    while len(markers) < COMMAND_PARTITIONS:
        oid = f"{MARKER}{uuid.uuid4().hex[:8]}"
        markers.setdefault(partition_for(oid, COMMAND_PARTITIONS), oid)
    body = {"type": "PlaceOrder", "customer_id": "end", "data": {"amount_cents": 1}}
    produce(commands_topic, [(oid, orjson.dumps({**body, "command_id": oid, "order_id": oid})) for oid in markers.values()])
    return set(markers.values())


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_sigkill_mid_stream_leaves_each_order_event_exactly_once(
    start_validator: Any, service_env: dict[str, str], prefix: str, guarantee: str
) -> None:
    commands_topic, events_topic, rejections_topic = (f"{prefix}order-{t}" for t in ("commands", "events", "rejections"))
    isolation = "read_committed" if guarantee == "exactly_once" else "read_uncommitted"
    env = {"STATEFLEET_VALIDATOR_DOMAIN": DOMAIN, "STATEFLEET_PROCESSING_GUARANTEE": guarantee}
    proc = start_validator("k", **env)
    feeder = feed_in_background(commands_topic, [command(i, step) for step in range(len(STEPS)) for i in range(ORDERS)])
    expected = ORDERS * len(EVENTS)
    record_count = RecordCount(events_topic)
    for fraction, wipe in ((0.3, False), (0.6, True)):
        wait_for(lambda f=fraction: record_count() >= expected * f, timeout=60, interval=0.05, message=f"{fraction:.0%}")
        proc.kill()
        if wipe:
            shutil.rmtree(Path(service_env["STATEFLEET_DATA_DIR"]) / "validator" / "k")
        proc = start_validator("k", **env)
    feeder.join(60)
    record_count.close()

    def read(topic: str) -> list[dict[str, Any]]:
        return [orjson.loads(r.body) for r in read_all(topic, isolation_level=isolation)]

    wait_for(lambda: len({e["event_id"] for e in read(events_topic)}) >= expected, timeout=60, message="every event")
    markers = end_markers(commands_topic)
    events = wait_for(
        lambda: (evs := read(events_topic)) and markers <= {e["aggregate_id"] for e in evs} and evs,
        timeout=60,
        message="the end markers' events",
    )
    events = [e for e in events if not e["aggregate_id"].startswith(MARKER)]
    rejections = read(rejections_topic)

    by_id: dict[str, dict[str, Any]] = {}
    for e in events:
        assert by_id.setdefault(e["event_id"], e) == e, "a replayed event differs from the original"
    per_order: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in by_id.values():
        per_order[e["aggregate_id"]].append(e)
    assert len(per_order) == ORDERS
    for i in range(ORDERS):
        oid = f"crash-order-{i}"
        evs = sorted(per_order[oid], key=lambda e: e["version"])
        assert [(e["type"], e["version"], e["command_id"]) for e in evs] == [
            (t, v, f"{oid}-{v - 1}") for v, t in enumerate(EVENTS, start=1)
        ], oid
        assert all(e["data"] == {"customer_id": f"cust-{i % 7}", "amount_cents": amount(i)} for e in evs), oid
    rejected = {(r["aggregate_id"], r["command_id"], r["reason"], r["current_version"]) for r in rejections}
    assert rejected == {(f"crash-order-{i}", f"crash-order-{i}-3", "INVALID_TRANSITION", 3) for i in range(ORDERS)}
    if guarantee == "exactly_once":
        assert len(events) == len(by_id), f"{len(events) - len(by_id)} repeated event records seen read_committed"
        assert len(rejections) == len(rejected), f"{len(rejections) - len(rejected)} repeated rejections seen read_committed"
    print(f"{guarantee}: {len(events)} event records, {len(by_id)} distinct; {len(rejections)} rejection records")
