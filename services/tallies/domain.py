"""Tally semantics, as pure functions. The Faust service and the Spark backfill both
run exactly these, so there is one definition of what a tally is.

An account counts by its status: active in numberActive, inactive (deactivated) in
numberInactive, deleted in neither. Each account event carries the account's version;
an event whose version is not newer than the one already applied is a replay and
changes nothing, so duplicated or replayed input never counts twice. lastLogin is the
largest login ``ts`` seen for the program, which replays cannot change either.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from shared.accounts import AccountChange, InvalidEvent, parse_event, status_after, tally_counts

#: Builds a NamedTuple from its fields in C, without the Python-level ``__new__`` the class
#: generates: these records are built several times per input record.
build_record = tuple.__new__


class InvalidInput(ValueError):
    """A message that cannot be applied; it goes to dead-letters with this message."""


class Login(NamedTuple):
    account_id: str
    program_id: str
    ts: int


class Membership(NamedTuple):
    """An account's standing in its program: its status after the newest applied version."""

    status: str
    version: int


@dataclass(frozen=True, slots=True)
class Tally:
    program_id: str
    numberActive: int
    numberInactive: int
    lastLogin: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "program_id": self.program_id,
            "numberActive": self.numberActive,
            "numberInactive": self.numberInactive,
            "lastLogin": self.lastLogin,
        }


def _require_str(obj: Mapping[str, Any], name: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"'{name}' must be a non-empty string, got {value!r}")
    return value


def _require_int(obj: Mapping[str, Any], name: str) -> int:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"'{name}' must be an integer, got {value!r}")
    return value


def parse_account_change(obj: Mapping[str, Any]) -> AccountChange:
    """Read an ``account-events`` record as every reader does (:func:`shared.accounts.parse_event`);
    raises :class:`InvalidInput` naming the bad field, as for any other bad input of the tallies.

    The change carries no ``occurred_at``: a tally does not depend on it, and the by-program
    hop does not carry it (:class:`~services.tallies.state.PackedInputs`)."""
    try:
        return parse_event(obj, False)
    except InvalidEvent as exc:
        raise InvalidInput(str(exc)) from exc


def parse_login(obj: Mapping[str, Any]) -> Login:
    """Read a ``logins`` record; raises :class:`InvalidInput` naming the bad field. A program_id
    with NUL is refused too: tally state keys use NUL as a separator."""
    account_id = obj.get("account_id")
    program_id = obj.get("program_id")
    ts = obj.get("ts")
    if (
        type(ts) is int
        and type(account_id) is str
        and account_id
        and type(program_id) is str
        and program_id
        and "\x00" not in program_id
    ):
        return build_record(Login, (account_id, program_id, ts))
    login = Login(
        account_id=_require_str(obj, "account_id"), program_id=_require_str(obj, "program_id"), ts=_require_int(obj, "ts")
    )
    if "\x00" in login.program_id:
        raise InvalidInput("'program_id' must not contain NUL")
    return login


def apply_change(current: Membership | None, change: AccountChange) -> Membership | None:
    """The account's membership after ``change``, or ``None`` when it is a replay."""
    if current is not None and change.version <= current.version:
        return None
    return build_record(Membership, (status_after(change.type, current.status if current is not None else None), change.version))


def count_delta(before: str | None, after: str) -> tuple[int, int]:
    """(Δ numberActive, Δ numberInactive) when an account moves from ``before`` to ``after``."""
    after_active, after_inactive = tally_counts(after)
    before_active, before_inactive = tally_counts(before)
    return after_active - before_active, after_inactive - before_inactive


def latest_login(current: int | None, ts: int) -> int:
    return ts if current is None or ts > current else current


def fold_program(program_id: str, changes: Iterable[AccountChange], logins: Iterable[Login]) -> Tally:
    """A program's tally from its whole history, in any order, duplicates included.

    Changes are applied per account in version order through :func:`apply_change`, as
    the stream applies them, so this equals what the service holds after the same input.
    """
    members: dict[str, Membership] = {}
    for change in sorted(changes, key=lambda c: (c.account_id, c.version)):
        updated = apply_change(members.get(change.account_id), change)
        if updated is not None:
            members[change.account_id] = updated
    counts = [tally_counts(m.status) for m in members.values()]
    active = sum(a for a, _ in counts)
    inactive = sum(i for _, i in counts)
    last: int | None = None
    for login in logins:
        last = latest_login(last, login.ts)
    return Tally(program_id=program_id, numberActive=active, numberInactive=inactive, lastLogin=last)
