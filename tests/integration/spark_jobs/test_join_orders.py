"""The join on another domain than the accounts, on the real broker: an order shipped within
the window after it was placed, per order, both kinds read from the orders' one event topic,
run through the job's command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_jobs import activation_join as aj
from tests.support.kafka import create_topics, produce, read_all

pytestmark = [pytest.mark.spark, pytest.mark.integration]

H = 3_600_000
D = 24 * H
T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z


def order_event(order_id: str, event_type: str, version: int, at: int, customer_id: str = "c1") -> tuple[str, bytes]:
    event = {
        "event_id": f"{order_id}:{version}",
        "command_id": f"c-{order_id}-{version}",
        "type": event_type,
        "aggregate_id": order_id,
        "version": version,
        "occurred_at": at,
        "data": {"customer_id": customer_id, "amount_cents": 100},
    }
    return order_id, json.dumps(event).encode()


def test_an_order_shipped_within_the_window_after_it_was_placed(spark, job_env: Path, prefix: str) -> None:  # type: ignore[no-untyped-def]
    events, output = f"{prefix}order-events", f"{prefix}order-shipments"
    create_topics([events], partitions=2)
    produce(
        events,
        [
            *[order_event("o-in", t, v, T0 + (v - 1) * H) for v, t in enumerate(["OrderPlaced", "OrderPaid"], 1)],
            order_event("o-in", "OrderShipped", 3, T0 + D),
            order_event("o-edge", "OrderPlaced", 1, T0, "c2"),
            order_event("o-edge", "OrderShipped", 2, T0 + 2 * D, "c2"),
            order_event("o-over", "OrderPlaced", 1, T0),
            order_event("o-over", "OrderShipped", 2, T0 + 2 * D + 1),
            order_event("o-paid", "OrderPlaced", 1, T0),
            order_event("o-paid", "OrderPaid", 2, T0 + H),  # another kind: not a shipment
            order_event("o-ghost", "OrderShipped", 3, T0 + H),  # never placed: no record
            order_event("o-adv", "OrderPlaced", 1, T0 + 5 * D),
            order_event("o-adv", "OrderShipped", 2, T0 + 5 * D),  # moves the watermark past the windows
            ("junk", b"not json"),
        ],
    )
    args = [
        *("--first-topic", "order-events", "--first-kind", "OrderPlaced", "--key", "aggregate_id"),
        *("--then-topic", "order-events", "--then-kind", "OrderShipped", "--then-time", "occurred_at"),
        *("--carry", "data.customer_id", "--key-name", "order_id", "--first-at-name", "placed_at"),
        *("--then-at-name", "shipped_at", "--matched-name", "shipped", "--window", "2d", "--output-topic", output),
    ]
    aj.main(["--available-now", *args])

    got: dict[str, list[dict[str, object]]] = {}
    for record in read_all(output):
        value = json.loads(record.value or b"null")
        assert record.key == value["order_id"].encode()
        got.setdefault(value["order_id"], []).append(value)

    def shipment(order: str, placed: int, shipped: int | None, customer: str = "c1") -> list[dict[str, object]]:
        return [
            {
                "order_id": order,
                "customer_id": customer,
                "placed_at": placed,
                "shipped_at": shipped,
                "shipped": shipped is not None,
            }
        ]

    assert got == {
        "o-in": shipment("o-in", T0, T0 + D),
        "o-edge": shipment("o-edge", T0, T0 + 2 * D, "c2"),
        "o-over": shipment("o-over", T0, None),
        "o-paid": shipment("o-paid", T0, None),
        "o-adv": shipment("o-adv", T0 + 5 * D, T0 + 5 * D),
    }
    # Its own checkpoint, named after its output; a second run over the same input adds nothing.
    assert (job_env / "checkpoint" / f"{prefix}join-{output}" / "commits").is_dir()
    aj.main(["--available-now", *args])
    assert len(read_all(output)) == len(got)
