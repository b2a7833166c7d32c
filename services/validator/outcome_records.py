"""The records the validator keeps of its answers: one per command id (GET
/commands/{command_id}: pending, then accepted or rejected) and one per item of a command
batch (GET /batches/{batch_id}). The aggregate id is kept under the domain's
``message_id_field`` (``account_id`` for accounts), as in its events and rejections."""

from __future__ import annotations

from typing import Any

from shared.domain import INVALID_COMMAND, Accepted, Domain, Duplicate, Outcome, Rejected

PENDING = "pending"
ACCEPTED = "accepted"
REJECTED = "rejected"


def outcome_record(
    domain: Domain[Any], outcome: Accepted[Any] | Rejected, *, at: int, event_json: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The record kept per command id for GET /commands/{command_id}; ``event_json`` is the
    accepted event's record when the caller has made it already."""
    if isinstance(outcome, Accepted):
        ev = outcome.event
        return {
            "status": ACCEPTED,
            "command_id": ev.command_id,
            domain.message_id_field: ev.aggregate_id,
            "event": event_json if event_json is not None else domain.event_json(ev),
            "rejection": None,
            "at": at,
        }
    rej = outcome.rejection
    return {
        "status": REJECTED,
        "command_id": rej.command_id,
        domain.message_id_field: rej.aggregate_id,
        "event": None,
        "rejection": domain.rejection_json(rej),
        "at": at,
    }


def pending_record(domain: Domain[Any], command_id: str, aggregate_id: str, *, at: int) -> dict[str, Any]:
    return {
        "status": PENDING,
        "command_id": command_id,
        domain.message_id_field: aggregate_id,
        "event": None,
        "rejection": None,
        "at": at,
    }


def batch_item_outcome(command_id: str, outcome: Outcome | None, error: str | None = None) -> dict[str, Any]:
    """What a batch keeps of one item's outcome. ``outcome`` None: the item could not be read
    as a command at all (``error`` says why); it is rejected INVALID_COMMAND."""
    if isinstance(outcome, Accepted):
        return {"command_id": command_id, "status": ACCEPTED, "reason": None, "version": outcome.event.version}
    if isinstance(outcome, Rejected):
        rej = outcome.rejection
        return {"command_id": command_id, "status": REJECTED, "reason": rej.reason, "detail": rej.detail}
    if isinstance(outcome, Duplicate):
        if isinstance(outcome.original, int):
            return {"command_id": command_id, "status": ACCEPTED, "reason": None, "version": outcome.original}
        return {"command_id": command_id, "status": REJECTED, "reason": outcome.original, "detail": "answered before"}
    return {"command_id": command_id, "status": REJECTED, "reason": INVALID_COMMAND, "detail": error or "not a command"}
