"""The orders domain: the example a team's domain module follows (docs/your-domain.md).

Run the validator with it: ``STATEFLEET_VALIDATOR_DOMAIN=examples.orders.domain:ORDERS``.

==========  ====================================================  ================================
type        accepted when                                         event, new status
==========  ====================================================  ================================
PlaceOrder  the order never existed; ``customer_id`` given;       OrderPlaced, version 1, placed
            ``data.amount_cents`` an int > 0
PayOrder    status placed                                         OrderPaid, paid
ShipOrder   status paid                                           OrderShipped, shipped
CancelOrder status placed or paid                                 OrderCancelled, cancelled
==========  ====================================================  ================================

The validator checks, in this order: a ``command_id`` seen before (the same outcome again),
INVALID_COMMAND (:func:`check_order_command`), for PlaceOrder ALREADY_EXISTS then
VERSION_CONFLICT unless ``expected_version`` is null or 0, for the other types NOT_FOUND then
VERSION_CONFLICT, and last :func:`decide_order` (INVALID_TRANSITION). ``customer_id`` is read
on PlaceOrder only. Every event's data carries the order's ``customer_id`` and
``amount_cents`` as placed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from shared.domain import INVALID_TRANSITION, Command, CommandEnvelope, Domain, DomainTopics, Event, Id, NewEvent, Reject

PLACE_ORDER = "PlaceOrder"
PAY_ORDER = "PayOrder"
SHIP_ORDER = "ShipOrder"
CANCEL_ORDER = "CancelOrder"
COMMAND_TYPES = (PLACE_ORDER, PAY_ORDER, SHIP_ORDER, CANCEL_ORDER)

ORDER_PLACED = "OrderPlaced"
ORDER_PAID = "OrderPaid"
ORDER_SHIPPED = "OrderShipped"
ORDER_CANCELLED = "OrderCancelled"
EVENT_TYPES = frozenset({ORDER_PLACED, ORDER_PAID, ORDER_SHIPPED, ORDER_CANCELLED})

PLACED = "placed"
PAID = "paid"
SHIPPED = "shipped"
CANCELLED = "cancelled"
STATUS_AFTER: Mapping[str, str] = {ORDER_PLACED: PLACED, ORDER_PAID: PAID, ORDER_SHIPPED: SHIPPED, ORDER_CANCELLED: CANCELLED}

#: Per command type other than PlaceOrder: the statuses it is accepted in, and its event.
TRANSITIONS: Mapping[str, tuple[frozenset[str], str]] = {
    PAY_ORDER: (frozenset({PLACED}), ORDER_PAID),
    SHIP_ORDER: (frozenset({PAID}), ORDER_SHIPPED),
    CANCEL_ORDER: (frozenset({PLACED, PAID}), ORDER_CANCELLED),
}

TOPICS = DomainTopics(
    commands="order-commands", events="order-events", rejections="order-rejections", command_batches="order-command-batches"
)


class OrderCommand(CommandEnvelope):
    """A command of the orders domain, as POST /commands takes it (and as records on
    ``order-commands`` carry it)."""

    type: Literal["PlaceOrder", "PayOrder", "ShipOrder", "CancelOrder"]
    order_id: Id
    customer_id: Id | None = Field(None, description="Required by PlaceOrder, read by it only")


@dataclass(frozen=True, slots=True)
class Order:
    status: str
    customer_id: str
    amount_cents: int


def order_to_json(order: Order) -> dict[str, Any]:
    return {"status": order.status, "customer_id": order.customer_id, "amount_cents": order.amount_cents}


def order_from_json(obj: Mapping[str, Any]) -> Order:
    return Order(status=obj["status"], customer_id=obj["customer_id"], amount_cents=obj["amount_cents"])


def amount_problem(value: Any) -> str | None:
    """Why ``value`` cannot be an order's amount: an integer (not a boolean) > 0."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        return f"'data.amount_cents' must be an integer > 0, got {value!r:.80}"
    return None


def check_order_command(command: Command) -> str | None:
    """INVALID_COMMAND beyond the envelope: a PlaceOrder needs a customer and an amount."""
    if command.type != PLACE_ORDER:
        return None
    if command.fields.get("customer_id") is None:
        return "PlaceOrder requires 'customer_id'"
    return amount_problem(command.data.get("amount_cents"))


def decide_order(order: Order | None, command: Command) -> NewEvent | Reject:
    if order is None:  # PlaceOrder, the only type that creates (checked by check_order_command)
        return NewEvent(
            ORDER_PLACED, {"customer_id": command.fields["customer_id"], "amount_cents": command.data["amount_cents"]}
        )
    allowed, event_type = TRANSITIONS[command.type]
    if order.status not in allowed:
        return Reject(INVALID_TRANSITION, f"cannot {command.type} an order that is {order.status}")
    return NewEvent(event_type, {"customer_id": order.customer_id, "amount_cents": order.amount_cents})


def evolve_order(order: Order | None, event: Event) -> Order:
    if order is None:
        return Order(status=PLACED, customer_id=event.data["customer_id"], amount_cents=event.data["amount_cents"])
    return Order(status=STATUS_AFTER[event.type], customer_id=order.customer_id, amount_cents=order.amount_cents)


ORDERS: Domain[Order] = Domain(
    name="orders",
    noun="order",
    command_model=OrderCommand,
    command_types=COMMAND_TYPES,
    creates=frozenset({PLACE_ORDER}),
    event_types=EVENT_TYPES,
    topics=TOPICS,
    decide=decide_order,
    evolve=evolve_order,
    state_to_json=order_to_json,
    state_from_json=order_from_json,
    aggregate_id_field="order_id",
    message_id_field="aggregate_id",
    command_fields=("customer_id",),
    check_command=check_order_command,
)
