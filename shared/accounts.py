"""The ``account-events`` contract, in one place: event types, the status each leaves an
account in, the account-change record, and which status counts where in a tally.

The validator writes these events, the tallies and the validator's program listing read
them, and the Spark jobs fold them; each uses this module, so an event type or a status
rule changes here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

ACCOUNT_CREATED = "AccountCreated"
ACCOUNT_UPDATED = "AccountUpdated"
ACCOUNT_DEACTIVATED = "AccountDeactivated"
ACCOUNT_REACTIVATED = "AccountReactivated"
ACCOUNT_DELETED = "AccountDeleted"

ACTIVE = "active"
INACTIVE = "inactive"
DELETED = "deleted"
#: The status of an account first seen through an event that does not set one.
UNKNOWN = "unknown"
STATUSES = (ACTIVE, INACTIVE, DELETED)

#: Status an account has after each event type; AccountUpdated keeps the status it had.
STATUS_AFTER: Mapping[str, str] = {
    ACCOUNT_CREATED: ACTIVE,
    ACCOUNT_DEACTIVATED: INACTIVE,
    ACCOUNT_REACTIVATED: ACTIVE,
    ACCOUNT_DELETED: DELETED,
}
EVENT_TYPES = frozenset(STATUS_AFTER) | {ACCOUNT_UPDATED}


class AccountChange(NamedTuple):
    """What readers of ``account-events`` take from an event (``occurred_at``: epoch ms, when read)."""

    account_id: str
    program_id: str
    type: str
    version: int
    occurred_at: int | None = None


def status_after(event_type: str, current: str | None) -> str:
    """An account's status after an event of ``event_type``, given its status before (None: not seen yet)."""
    status = STATUS_AFTER.get(event_type)
    if status is not None:
        return status
    return current if current is not None else UNKNOWN


def tally_counts(status: str | None) -> tuple[int, int]:
    """Where an account with ``status`` counts: (numberActive, numberInactive). A deleted or
    unknown account counts in neither."""
    if status == ACTIVE:
        return 1, 0
    if status == INACTIVE:
        return 0, 1
    return 0, 0
