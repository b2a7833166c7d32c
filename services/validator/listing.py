"""The category projection's rule (GET /programs/{program_id}/accounts) as a pure function:
how one account's row in its program's listing changes with an event."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.accounts import AccountChange, status_after


@dataclass(frozen=True, slots=True)
class Listing:
    """An account as its program's listing shows it."""

    account_id: str
    program_id: str
    status: str
    version: int
    created_at: int
    updated_at: int

    def to_json(self) -> dict[str, Any]:
        return {
            "account_id": self.account_id,
            "program_id": self.program_id,
            "status": self.status,
            "version": self.version,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


def apply_to_listing(current: Listing | None, change: AccountChange) -> Listing | None:
    """The listing row after ``change``, or None when it is a replay (version not newer).

    An account first seen through an event other than AccountCreated (its creation is
    no longer on the topic) is listed from that event, with status ``unknown`` if the
    event does not say.
    """
    if current is not None and change.version <= current.version:
        return None
    if current is None:
        status = status_after(change.type, None)
        at = change.occurred_at or 0
        return Listing(
            account_id=change.account_id,
            program_id=change.program_id,
            status=status,
            version=change.version,
            created_at=at,
            updated_at=at,
        )
    return Listing(
        account_id=current.account_id,
        program_id=current.program_id,
        status=status_after(change.type, current.status),
        version=change.version,
        created_at=current.created_at,
        updated_at=change.occurred_at or current.updated_at,
    )
