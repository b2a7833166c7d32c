"""Command validation as pure functions: no Faust, no Kafka, no clock.

:func:`decide` is the whole of the validator's judgement: given an account's current
state, the command ids already answered for it and one command, it returns the
outcome, which is an event (version + 1), a rejection with a reason, or "duplicate"
when the command id was answered before. :func:`plan_batch` applies it to a batch
of commands in order, so command n+1 is always decided against the state left by
command n, including when both are in the same batch.

Everything an outcome contains is derived from the state and the command alone:
the event id from (account_id, command_id), ``occurred_at`` from the command's
``issued_at`` (or, when the command has none, from the timestamp of its Kafka
record). Deciding the same command against the same state therefore gives the same
event byte for byte, which is what makes a replay after a crash recognisable.

Transitions (contract):

=================  ==================================  ====================
command            accepted when                       event
=================  ==================================  ====================
CreateAccount      account never existed (program_id)  AccountCreated, v1
UpdateAccount      exists, not deleted                 AccountUpdated
DeactivateAccount  status active                       AccountDeactivated
ReactivateAccount  status inactive                     AccountReactivated
DeleteAccount      exists, not deleted                 AccountDeleted
=================  ==================================  ====================

Checks run in this order, and the first that fails is the reason:
INVALID_COMMAND (malformed), then ALREADY_EXISTS for a create of an id that exists
or existed (ids are never reused), NOT_FOUND, DELETED, INVALID_COMMAND for a
program_id that is not the account's, VERSION_CONFLICT when ``expected_version`` is
given and differs from the current version (0 before the account exists), and
finally INVALID_TRANSITION.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.accounts import (
    ACCOUNT_CREATED,
    ACCOUNT_DEACTIVATED,
    ACCOUNT_DELETED,
    ACCOUNT_REACTIVATED,
    ACCOUNT_UPDATED,
    ACTIVE,
    DELETED,
    EVENT_TYPES,
    INACTIVE,
    STATUS_AFTER,
    id_problem,
)
from shared.accounts import MAX_ID_LENGTH as MAX_ID_LENGTH  # the longest id of a command, as of an event

CREATE_ACCOUNT = "CreateAccount"
UPDATE_ACCOUNT = "UpdateAccount"
DEACTIVATE_ACCOUNT = "DeactivateAccount"
REACTIVATE_ACCOUNT = "ReactivateAccount"
DELETE_ACCOUNT = "DeleteAccount"
COMMAND_TYPES = (CREATE_ACCOUNT, UPDATE_ACCOUNT, DEACTIVATE_ACCOUNT, REACTIVATE_ACCOUNT, DELETE_ACCOUNT)

EVENT_FOR: Mapping[str, str] = {
    CREATE_ACCOUNT: ACCOUNT_CREATED,
    UPDATE_ACCOUNT: ACCOUNT_UPDATED,
    DEACTIVATE_ACCOUNT: ACCOUNT_DEACTIVATED,
    REACTIVATE_ACCOUNT: ACCOUNT_REACTIVATED,
    DELETE_ACCOUNT: ACCOUNT_DELETED,
}
assert frozenset(EVENT_FOR.values()) == EVENT_TYPES, "every event type of the contract has its command"

NOT_FOUND = "NOT_FOUND"
ALREADY_EXISTS = "ALREADY_EXISTS"
DELETED_REASON = "DELETED"
VERSION_CONFLICT = "VERSION_CONFLICT"
INVALID_TRANSITION = "INVALID_TRANSITION"
INVALID_COMMAND = "INVALID_COMMAND"
REASONS = (NOT_FOUND, ALREADY_EXISTS, DELETED_REASON, VERSION_CONFLICT, INVALID_TRANSITION, INVALID_COMMAND)

#: Event ids are UUIDv5 in this namespace of (account_id, command_id).
EVENT_ID_NAMESPACE = uuid.UUID("5b0c4a34-8f3e-4d0e-9d6c-1f6f2a7c9e51")

#: What is remembered of an answered command: its event's version, or its rejection reason.
OutcomeCode = int | str


class MalformedCommand(ValueError):
    """A record that cannot even be rejected (no readable command_id and account_id)."""


@dataclass(frozen=True, slots=True)
class Command:
    """One command. ``invalid`` says why it is malformed; such a command is rejected
    with INVALID_COMMAND (its ids were readable, so the rejection can say whose it is)."""

    command_id: str
    account_id: str
    type: str
    program_id: str | None = None
    expected_version: int | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    issued_at: int = 0
    invalid: str | None = None

    @property
    def storable(self) -> bool:
        """Whether the account id can key a state row (else the command is answered statelessly)."""
        return len(self.account_id) <= MAX_ID_LENGTH and "\x00" not in self.account_id

    def to_json(self) -> dict[str, Any]:
        return {
            "command_id": self.command_id,
            "type": self.type,
            "account_id": self.account_id,
            "program_id": self.program_id,
            "expected_version": self.expected_version,
            "data": dict(self.data),
            "issued_at": self.issued_at,
        }


@dataclass(frozen=True, slots=True)
class Account:
    account_id: str
    program_id: str
    status: str
    version: int
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"account_id": self.account_id, "program_id": self.program_id, "status": self.status, "version": self.version}


@dataclass(frozen=True, slots=True)
class Event:
    event_id: str
    command_id: str
    type: str
    account_id: str
    program_id: str
    version: int
    occurred_at: int
    data: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "command_id": self.command_id,
            "type": self.type,
            "account_id": self.account_id,
            "program_id": self.program_id,
            "version": self.version,
            "occurred_at": self.occurred_at,
            "data": dict(self.data),
        }


@dataclass(frozen=True, slots=True)
class Rejection:
    command_id: str
    account_id: str
    reason: str
    detail: str
    current_version: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "command_id": self.command_id,
            "account_id": self.account_id,
            "reason": self.reason,
            "detail": self.detail,
            "current_version": self.current_version,
        }


@dataclass(frozen=True, slots=True)
class Accepted:
    event: Event
    account: Account

    @property
    def code(self) -> OutcomeCode:
        return self.event.version


@dataclass(frozen=True, slots=True)
class Rejected:
    rejection: Rejection

    @property
    def code(self) -> OutcomeCode:
        return self.rejection.reason


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The command id was answered before: ``original`` is that answer (version or reason)."""

    command_id: str
    account_id: str
    original: OutcomeCode


Outcome = Accepted | Rejected | Duplicate


@dataclass(slots=True)
class AccountState:
    """What the validator keeps per account id: the account (None while it never existed)
    and the ids of the commands answered for it, oldest first, with their outcome codes."""

    account: Account | None = None
    history: dict[str, OutcomeCode] = field(default_factory=dict)

    def remember(self, command_id: str, code: OutcomeCode, limit: int) -> None:
        self.history[command_id] = code
        while len(self.history) > limit:
            del self.history[next(iter(self.history))]


_NAMESPACE_BYTES = EVENT_ID_NAMESPACE.bytes


def event_id_for(account_id: str, command_id: str) -> str:
    """The event id of the event a command produces: the same command, the same id.

    ``uuid.uuid5(EVENT_ID_NAMESPACE, account_id + NUL + command_id)`` as text, computed without
    the UUID object (once per command; the object's construction and formatting cost more than
    the hash)."""
    digest = bytearray(hashlib.sha1(_NAMESPACE_BYTES + f"{account_id}\x00{command_id}".encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# -- parsing -------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def id_field_problem(name: str, value: Any, *, required: bool) -> str | None:
    if value is None:
        return f"'{name}' is required" if required else None
    return id_problem(name, value)


def parse_command(obj: Mapping[str, Any], *, default_issued_at: int) -> Command:
    """Read a command from its JSON object.

    Raises :class:`MalformedCommand` when ``command_id`` or ``account_id`` is not a
    non-empty string (such a record cannot be answered and becomes a dead letter).
    Any other problem gives a :class:`Command` with ``invalid`` set. A missing
    ``issued_at`` takes ``default_issued_at`` (the record's timestamp); missing
    ``data`` is ``{}``.
    """
    command_id = obj.get("command_id")
    account_id = obj.get("account_id")
    if not isinstance(command_id, str) or not command_id:
        raise MalformedCommand(f"'command_id' must be a non-empty string, got {command_id!r:.80}")
    if not isinstance(account_id, str) or not account_id:
        raise MalformedCommand(f"'account_id' must be a non-empty string, got {account_id!r:.80}")

    problems: list[str] = []
    command_type = obj.get("type")
    if not isinstance(command_type, str) or command_type not in COMMAND_TYPES:
        problems.append(f"unknown command type {command_type!r:.80}; expected one of {', '.join(COMMAND_TYPES)}")
        command_type = command_type if isinstance(command_type, str) else ""
    for name, value in (("command_id", command_id), ("account_id", account_id)):
        problem = id_field_problem(name, value, required=True)
        if problem:
            problems.append(problem)
    program_id = obj.get("program_id")
    problem = id_field_problem("program_id", program_id, required=False)
    if problem:
        problems.append(problem)
        program_id = None
    expected_version = obj.get("expected_version")
    if expected_version is not None and (not _is_int(expected_version) or expected_version < 0):
        problems.append(f"'expected_version' must be null or an integer >= 0, got {expected_version!r:.80}")
        expected_version = None
    data = obj.get("data", {})
    if data is None:
        data = {}
    if not isinstance(data, dict):
        problems.append(f"'data' must be a JSON object, got {type(data).__name__}")
        data = {}
    issued_at = obj.get("issued_at")
    if issued_at is None:
        issued_at = default_issued_at
    elif not _is_int(issued_at):
        problems.append(f"'issued_at' must be an integer (epoch ms), got {issued_at!r:.80}")
        issued_at = default_issued_at
    if command_type == CREATE_ACCOUNT and program_id is None and not problems:
        problems.append("CreateAccount requires 'program_id'")
    return Command(
        command_id=command_id,
        account_id=account_id,
        type=command_type,
        program_id=program_id,
        expected_version=expected_version,
        data=data,
        issued_at=issued_at,
        invalid="; ".join(problems) or None,
    )


# -- deciding ------------------------------------------------------------------------------


def _reject(command: Command, reason: str, detail: str, account: Account | None) -> Rejected:
    return Rejected(
        Rejection(
            command_id=command.command_id,
            account_id=command.account_id,
            reason=reason,
            detail=detail,
            current_version=account.version if account is not None else None,
        )
    )


def _accept(
    command: Command, account: Account | None, program_id: str, data: Mapping[str, Any], event_data: Mapping[str, Any]
) -> Accepted:
    event_type = EVENT_FOR[command.type]
    version = account.version + 1 if account is not None else 1
    status = STATUS_AFTER.get(event_type, account.status if account is not None else ACTIVE)
    event = Event(
        event_id=event_id_for(command.account_id, command.command_id),
        command_id=command.command_id,
        type=event_type,
        account_id=command.account_id,
        program_id=program_id,
        version=version,
        occurred_at=command.issued_at,
        data=event_data,
    )
    return Accepted(
        event=event,
        account=Account(account_id=command.account_id, program_id=program_id, status=status, version=version, data=data),
    )


def decide(account: Account | None, seen: Mapping[str, OutcomeCode], command: Command) -> Outcome:
    """The outcome of ``command`` for an account in state ``account`` (None: never existed).

    ``seen`` maps the command ids already answered for this account to their outcome
    codes; a command id found there is a :class:`Duplicate` and changes nothing.
    """
    original = seen.get(command.command_id)
    if original is not None:
        return Duplicate(command_id=command.command_id, account_id=command.account_id, original=original)
    if command.invalid is not None:
        return _reject(command, INVALID_COMMAND, command.invalid, account)

    if command.type == CREATE_ACCOUNT:
        if account is not None:
            detail = (
                f"account {command.account_id!r} was deleted; account ids are never reused"
                if account.status == DELETED
                else f"account {command.account_id!r} already exists"
            )
            return _reject(command, ALREADY_EXISTS, detail, account)
        if command.expected_version not in (None, 0):
            return _reject(
                command,
                VERSION_CONFLICT,
                f"expected version {command.expected_version}, but the account does not exist yet (version 0)",
                account,
            )
        assert command.program_id is not None  # parse_command marks a create without one invalid
        return _accept(command, None, command.program_id, command.data, command.data)

    if account is None:
        return _reject(command, NOT_FOUND, f"account {command.account_id!r} does not exist", account)
    if account.status == DELETED:
        return _reject(command, DELETED_REASON, f"account {command.account_id!r} is deleted", account)
    if command.program_id is not None and command.program_id != account.program_id:
        return _reject(
            command,
            INVALID_COMMAND,
            f"program_id {command.program_id!r} is not the account's program {account.program_id!r}",
            account,
        )
    if command.expected_version is not None and command.expected_version != account.version:
        return _reject(
            command,
            VERSION_CONFLICT,
            f"expected version {command.expected_version}, current version is {account.version}",
            account,
        )

    if command.type == UPDATE_ACCOUNT:
        merged = {**account.data, **command.data}
        return _accept(command, account, account.program_id, merged, merged)
    if command.type == DELETE_ACCOUNT:
        return _accept(command, account, account.program_id, account.data, command.data)
    if command.type == DEACTIVATE_ACCOUNT:
        if account.status != ACTIVE:
            return _reject(command, INVALID_TRANSITION, f"cannot deactivate an account that is {account.status}", account)
        return _accept(command, account, account.program_id, account.data, command.data)
    # REACTIVATE_ACCOUNT (parse_command admits no other type)
    if account.status != INACTIVE:
        return _reject(command, INVALID_TRANSITION, f"cannot reactivate an account that is {account.status}", account)
    return _accept(command, account, account.program_id, account.data, command.data)


@dataclass
class BatchPlan:
    """Outcomes of a batch, one per command in input order, and the state rows to write."""

    outcomes: list[Outcome]
    states: dict[str, AccountState]


def plan_batch(commands: Iterable[Command], load: Callable[[str], AccountState | None], history_limit: int) -> BatchPlan:
    """Decide ``commands`` in order; each is decided against the state left by the ones before.

    ``load`` reads an account's stored state (called at most once per account). The
    returned ``states`` are the rows that changed (an answered command is remembered
    even when rejected); duplicates change nothing. Commands whose account id cannot
    key a row are answered without state.
    """
    cache: dict[str, AccountState] = {}
    changed: dict[str, AccountState] = {}
    outcomes: list[Outcome] = []
    for command in commands:
        if not command.storable:
            outcomes.append(decide(None, {}, command))
            continue
        state = cache.get(command.account_id)
        if state is None:
            state = load(command.account_id) or AccountState()
            cache[command.account_id] = state
        outcome = decide(state.account, state.history, command)
        outcomes.append(outcome)
        if isinstance(outcome, Duplicate):
            continue
        if isinstance(outcome, Accepted):
            state.account = outcome.account
        state.remember(command.command_id, outcome.code, history_limit)
        changed[command.account_id] = state
    return BatchPlan(outcomes=outcomes, states=changed)
