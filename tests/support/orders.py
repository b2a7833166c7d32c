"""Order events as the orders domain writes them (``order-events``), and the rows the contract
gives for them: the oracle of the orders projection's tests."""

from __future__ import annotations

import random
from typing import Any

#: The topics of a release that names the orders domain and projection, as the validator and
#: the tallies name them (without the prefix): what the topic Job creates for them.
ORDER_TOPICS = (
    "order-commands",
    "order-command-batches",
    "order-events",
    "order-rejections",
    "order-tallies",
    "retry-tallies-orders",
    "statefleet-tallies-orders-memberships-changelog",
    "statefleet-tallies-orders-last-logins-changelog",
    "statefleet-tallies-orders-published-tallies-changelog",
)

#: Each order's events in version order, by the path it takes.
PATHS = [
    ["OrderPlaced"],
    ["OrderPlaced", "OrderPaid"],
    ["OrderPlaced", "OrderPaid", "OrderShipped"],
    ["OrderPlaced", "OrderCancelled"],
    ["OrderPlaced", "OrderPaid", "OrderCancelled"],
]


def order_event(order: str, customer: str, type_: str, version: int, amount: int = 1500) -> dict[str, Any]:
    return {
        "event_id": f"{order}-{version}",
        "command_id": f"c-{order}-{version}",
        "type": type_,
        "aggregate_id": order,
        "version": version,
        "occurred_at": 1_700_000_000_000 + version,
        "data": {"customer_id": customer, "amount_cents": amount},
    }


def history(seed: int, orders: int = 20, customers: int = 4, prefix: str = "") -> list[dict[str, Any]]:
    rng = random.Random(seed)
    events: list[dict[str, Any]] = []
    for n in range(orders):
        customer, amount = f"{prefix}c{rng.randrange(customers)}", rng.randrange(1, 10_000)
        path = rng.choice(PATHS)
        events += [order_event(f"{prefix}o{n}", customer, t, v, amount) for v, t in enumerate(path, start=1)]
    return events


def expected_rows(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The rows by the contract, from each order's last event: the oracle."""
    last: dict[str, dict[str, Any]] = {}
    for e in events:
        if e["aggregate_id"] not in last or e["version"] > last[e["aggregate_id"]]["version"]:
            last[e["aggregate_id"]] = e
    rows: dict[str, dict[str, Any]] = {}
    for e in last.values():
        customer = e["data"]["customer_id"]
        row = rows.setdefault(customer, {"key": customer, "open": 0, "shipped": 0, "cancelled": 0, "revenue_cents": 0})
        if e["type"] in ("OrderPlaced", "OrderPaid"):
            row["open"] += 1
        elif e["type"] == "OrderShipped":
            row["shipped"] += 1
            row["revenue_cents"] += e["data"]["amount_cents"]
        else:
            row["cancelled"] += 1
    return rows
