"""The orders projection: one row per customer, from the orders domain's ``order-events``.

``GET /tallies/{customer_id}`` on the tallies service (run with
``STATEFLEET_TALLIES_PROJECTION=examples.orders.projection:PROJECTION``, or ``make up
DOMAIN=orders``) answers ``{"key", "open", "shipped", "cancelled", "revenue_cents"}``: ``open``
counts the customer's orders that are placed or paid, ``shipped`` and ``cancelled`` those in
that status, and ``revenue_cents`` sums the amounts of the shipped ones. The same rows go to the
compacted ``order-tallies`` topic, keyed by customer_id.

Each order event names its order (``aggregate_id``), the order's version (1, 2, 3… per order),
its type and, in ``data``, the order's ``customer_id`` and ``amount_cents``. An order's status
after an event is set by the event's type alone, so the order's standing is its status and
amount after the newest version seen: a replayed, duplicated or late (older version) event
changes nothing, whatever the order the events arrive in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

from shared.projection import Change, Input, InvalidInput, Projection, build_record, require_int, require_key

ORDER_EVENTS = "order-events"
ORDER_TALLIES = "order-tallies"

PLACED = "placed"
PAID = "paid"
SHIPPED = "shipped"
CANCELLED = "cancelled"
#: The status an order has after each event type.
STATUS_AFTER: Mapping[str, str] = {"OrderPlaced": PLACED, "OrderPaid": PAID, "OrderShipped": SHIPPED, "OrderCancelled": CANCELLED}


class OrderTally(BaseModel):
    key: str = Field(description="The customer_id")
    open: int = Field(description="The customer's orders that are placed or paid")
    shipped: int = Field(description="The customer's shipped orders")
    cancelled: int = Field(description="The customer's cancelled orders")
    revenue_cents: int = Field(description="The sum of the amounts of the customer's shipped orders")


def read_order_event(obj: Mapping[str, Any]) -> Change:
    """An ``order-events`` record as the change of its order, in its customer's row. The change's
    event is the order's standing after it: ``status:amount_cents``."""
    event_type = obj.get("type")
    status = STATUS_AFTER.get(event_type) if type(event_type) is str else None
    if status is None:
        raise InvalidInput(f"unknown order event type {event_type!r:.80}")
    version = require_int(obj, "version", minimum=1)
    order_id = require_key(obj, "aggregate_id")
    data = obj.get("data")
    if not isinstance(data, dict):
        raise InvalidInput(f"'data' must be an object, got {data!r:.80}")
    customer_id = require_key(data, "customer_id")
    amount = require_int(data, "amount_cents", minimum=0)
    return build_record(Change, (order_id, customer_id, f"{status}:{amount}", version))


def evolve(standing: str | None, event: str) -> str:
    """An order's standing after an event: the one the event states (the type sets the status)."""
    return event


def contribution(standing: str) -> tuple[int, int, int, int]:
    """What an order adds to its customer's (open, shipped, cancelled, revenue_cents)."""
    status, _, amount = standing.partition(":")
    if status in (PLACED, PAID):
        return 1, 0, 0, 0
    if status == SHIPPED:
        return 0, 1, 0, int(amount)
    if status == CANCELLED:
        return 0, 0, 1, 0
    return 0, 0, 0, 0


def row(customer_id: str, totals: tuple[int, ...] | None, mark: int | None) -> dict[str, Any]:
    """The customer's row (``GET /tallies/{customer_id}`` and the ``order-tallies`` value)."""
    open_, shipped, cancelled, revenue = totals if totals is not None else (0, 0, 0, 0)
    return {"key": customer_id, "open": open_, "shipped": shipped, "cancelled": cancelled, "revenue_cents": revenue}


PROJECTION = Projection(
    name="orders",
    inputs=(Input(ORDER_EVENTS, read_order_event),),
    output_topic=ORDER_TALLIES,
    key_field="key",
    counters=("open", "shipped", "cancelled", "revenue_cents"),
    evolve=evolve,
    contribution=contribution,
    row=row,
    row_model=OrderTally,
    description="Orders per customer (open, shipped, cancelled, revenue_cents), from any instance.",
)
