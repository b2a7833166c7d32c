"""The ``account-events`` contract, in one place: event types, the status each leaves an
account in, the account-change record, which status counts where in a tally, and the one
reading of an event (:func:`parse_event`).

The validator writes these events, the tallies and the validator's program listing read
them, and the Spark jobs fold them; each uses this module, so an event type, a status
rule or what makes an event well-formed changes here and nowhere else. Every reader
takes an event through :func:`parse_event`, so a record is either read alike by all of
them or refused by all of them: the services dead-letter it (:class:`InvalidEvent`, a
permanent error the retry scheduler parks at once) and never count it, the Spark jobs
skip it and report it as skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from shared.domain import MAX_ID_LENGTH as MAX_ID_LENGTH  # the longest id of an event, as of a command
from shared.domain import id_problem as id_problem  # what makes an id, one rule for commands and events

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


class InvalidEvent(ValueError):
    """An ``account-events`` record that breaks the contract's Event shape.

    A permanent error: the same bytes are refused however often they are read, so the
    retry scheduler's default policy parks such a dead letter at once (never retried)."""


#: Builds the NamedTuple from its fields in C, without the Python-level ``__new__`` the class
#: generates (every account event passes here).
_build = tuple.__new__


def parse_event(obj: Mapping[str, Any], timed: bool = True) -> AccountChange:
    """Read an ``account-events`` record (its JSON object); raises :class:`InvalidEvent` naming
    the first bad field. ``timed=False`` leaves ``occurred_at`` out of the change (None), for a
    reader that does not depend on it; the record is checked alike.

    Checked, in this order, are the fields a reader takes: ``type`` (one of
    :data:`EVENT_TYPES`), ``version`` (an integer >= 1), ``account_id`` and ``program_id``
    (see :func:`id_problem`) and ``occurred_at`` (an integer, epoch ms). ``event_id``,
    ``command_id`` and ``data`` are read by no one and not checked; other fields are ignored.
    """
    event_type = obj.get("type")
    account_id = obj.get("account_id")
    program_id = obj.get("program_id")
    version = obj.get("version")
    occurred_at = obj.get("occurred_at")
    # The common case in one expression (a hot path: the tallies read every event here);
    # anything else is re-checked field by field for the error message.
    if (
        type(event_type) is str
        and event_type in EVENT_TYPES
        and type(version) is int
        and version >= 1
        and type(occurred_at) is int
        and type(account_id) is str
        and 0 < len(account_id) <= MAX_ID_LENGTH
        and "\x00" not in account_id
        and type(program_id) is str
        and 0 < len(program_id) <= MAX_ID_LENGTH
        and "\x00" not in program_id
    ):
        return _build(AccountChange, (account_id, program_id, event_type, version, occurred_at if timed else None))
    raise InvalidEvent(_event_problem(obj))


def _event_problem(obj: Mapping[str, Any]) -> str:
    event_type = obj.get("type")
    if not isinstance(event_type, str) or event_type not in EVENT_TYPES:
        return f"unknown event type {event_type!r:.80}"
    version = obj.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        return f"'version' must be an integer, got {version!r:.80}"
    if version < 1:
        return f"'version' must be >= 1, got {version}"
    for name in ("account_id", "program_id"):
        problem = id_problem(name, obj.get(name))
        if problem is not None:
            return problem
    occurred_at = obj.get("occurred_at")
    if not isinstance(occurred_at, int) or isinstance(occurred_at, bool):
        return f"'occurred_at' must be an integer (epoch ms), got {occurred_at!r:.80}"
    return "not an account event"  # not reached: parse_event accepts what passes every check above
