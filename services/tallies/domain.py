"""The bundled default projection: the accounts tallies, written with the projection API
(:mod:`shared.projection`) as any team's projection is. The Faust service and the Spark
backfill both run exactly these rules, so there is one definition of what a tally is.

An account counts by its status: active in numberActive, inactive (deactivated) in
numberInactive, deleted in neither. Each account event carries the account's version;
an event whose version is not newer than the one already applied is a replay and
changes nothing, so duplicated or replayed input never counts twice. lastLogin is the
largest login ``ts`` seen for the program (the projection's mark), which replays cannot
change either.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from services.tallies.models import TallyOut
from shared.accounts import AccountChange, InvalidEvent, parse_event, status_after, tally_counts
from shared.projection import Change, Input, InvalidInput, Mark, Membership, Projection, advance, build_record, delta, fold
from shared.topics import ACCOUNT_EVENTS, LOGINS, PROGRAM_TALLIES

__all__ = ["PROJECTION", "InvalidInput", "Login", "Membership", "Tally", "build_record"]


class Login(NamedTuple):
    account_id: str
    program_id: str
    ts: int


@dataclass(frozen=True, slots=True)
class Tally:
    program_id: str
    numberActive: int
    numberInactive: int
    lastLogin: int | None

    def to_json(self) -> dict[str, Any]:
        return tally_row(self.program_id, (self.numberActive, self.numberInactive), self.lastLogin)


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


def read_account_event(obj: Mapping[str, Any]) -> Change:
    """The projection's reader of ``account-events``: the account's change
    (:func:`parse_account_change`), its event being the event type."""
    return build_record(Change, parse_account_change(obj)[:4])


def read_login(obj: Mapping[str, Any]) -> Mark:
    """The projection's reader of ``logins``: the login's ts, a mark of its program."""
    login = parse_login(obj)
    return build_record(Mark, (login.program_id, login.ts))


def evolve(status: str | None, event_type: str) -> str:
    """An account's status after an event of ``event_type`` (:func:`shared.accounts.status_after`)."""
    return status_after(event_type, status)


def tally_row(program_id: str, totals: tuple[int, ...] | None, last_login: int | None) -> dict[str, Any]:
    """The published tally (the ``program-tallies`` value and the body of ``GET /tallies/{program_id}``)."""
    active, inactive = totals if totals is not None else (0, 0)
    return {"program_id": program_id, "numberActive": active, "numberInactive": inactive, "lastLogin": last_login}


#: The accounts tallies, the projection the service runs unless ``STATEFLEET_TALLIES_PROJECTION``
#: names another.
PROJECTION = Projection(
    name="accounts",
    inputs=(Input(ACCOUNT_EVENTS, read_account_event), Input(LOGINS, read_login)),
    output_topic=PROGRAM_TALLIES,
    key_field="program_id",
    counters=("numberActive", "numberInactive"),
    evolve=evolve,
    contribution=tally_counts,
    row=tally_row,
    row_model=TallyOut,
    description="Running tallies per program (numberActive, numberInactive, lastLogin), from any instance.",
)


def as_change(change: AccountChange) -> Change:
    return build_record(Change, change[:4])


def apply_change(current: Membership | None, change: AccountChange) -> Membership | None:
    """The account's membership after ``change``, or ``None`` when it is a replay."""
    return advance(evolve, current, as_change(change))


def count_delta(before: str | None, after: str) -> tuple[int, ...]:
    """(Δ numberActive, Δ numberInactive) when an account moves from ``before`` to ``after``."""
    return delta(tally_counts, before, after)


def fold_program(program_id: str, changes: Iterable[AccountChange], logins: Iterable[Login]) -> Tally:
    """A program's tally from its whole history, in any order, duplicates included
    (:func:`shared.projection.fold` of :data:`PROJECTION`, as the service applies it)."""
    totals, last = fold(PROJECTION, (as_change(c) for c in changes), (login.ts for login in logins))
    active, inactive = totals if totals is not None else (0, 0)
    return Tally(program_id=program_id, numberActive=active, numberInactive=inactive, lastLogin=last)
