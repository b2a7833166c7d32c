"""The accounts domain, the validator's bundled default, written through the domain API
(:mod:`shared.domain`) like any team's domain: its command envelope, the transition rules in
:func:`decide_account`, how each event changes an account (:func:`evolve_account`) and its
topics. Idempotency, existence and version checks, versions and event ids are the API's.

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
INVALID_COMMAND (malformed, or a create without program_id), then ALREADY_EXISTS for a
create of an id that exists or existed (ids are never reused), NOT_FOUND, DELETED,
INVALID_COMMAND for a program_id that is not the account's (:func:`guard_account`),
VERSION_CONFLICT when ``expected_version`` is given and differs from the current version
(0 before the account exists), and finally INVALID_TRANSITION.

Every event carries the account's ``program_id`` at its top level; an UpdateAccount's event
carries the merged data, the other events the command's data.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from pydantic import Field

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
)
from shared.domain import ALREADY_EXISTS as ALREADY_EXISTS
from shared.domain import (
    INVALID_COMMAND,
    INVALID_TRANSITION,
    REASONS,
    Command,
    CommandEnvelope,
    Domain,
    DomainTopics,
    Event,
    Id,
    NewEvent,
    Reject,
)
from shared.topics import ACCOUNT_COMMAND_BATCHES, ACCOUNT_COMMANDS, ACCOUNT_EVENTS, ACCOUNT_REJECTIONS

CREATE_ACCOUNT = "CreateAccount"
UPDATE_ACCOUNT = "UpdateAccount"
DEACTIVATE_ACCOUNT = "DeactivateAccount"
REACTIVATE_ACCOUNT = "ReactivateAccount"
DELETE_ACCOUNT = "DeleteAccount"
COMMAND_TYPES = (CREATE_ACCOUNT, UPDATE_ACCOUNT, DEACTIVATE_ACCOUNT, REACTIVATE_ACCOUNT, DELETE_ACCOUNT)
CommandType = Literal["CreateAccount", "UpdateAccount", "DeactivateAccount", "ReactivateAccount", "DeleteAccount"]

EVENT_FOR: Mapping[str, str] = {
    CREATE_ACCOUNT: ACCOUNT_CREATED,
    UPDATE_ACCOUNT: ACCOUNT_UPDATED,
    DEACTIVATE_ACCOUNT: ACCOUNT_DEACTIVATED,
    REACTIVATE_ACCOUNT: ACCOUNT_REACTIVATED,
    DELETE_ACCOUNT: ACCOUNT_DELETED,
}
assert frozenset(EVENT_FOR.values()) == EVENT_TYPES, "every event type of the contract has its command"

DELETED_REASON = "DELETED"
ACCOUNT_REASONS = (*REASONS[:2], DELETED_REASON, *REASONS[2:])
PROGRAM_ID = "program_id"


class CommandIn(CommandEnvelope):
    """A command as POST /commands takes it (the accounts domain's command schema)."""

    type: CommandType
    account_id: Id
    program_id: Id | None = Field(None, description="Required by CreateAccount")


class Account(NamedTuple):
    """The accounts domain's state of one account (a tuple: one is made per accepted command,
    and a tuple is made in C)."""

    program_id: str
    status: str
    data: Mapping[str, Any] = MappingProxyType({})


def account_to_json(account: Account) -> dict[str, Any]:
    return {"program_id": account.program_id, "status": account.status, "data": dict(account.data)}


def account_from_json(obj: Mapping[str, Any]) -> Account:
    return Account(program_id=obj["program_id"], status=obj["status"], data=obj.get("data") or {})


def check_account_command(command: Command) -> str | None:
    if command.type == CREATE_ACCOUNT and command.fields.get(PROGRAM_ID) is None:
        return "CreateAccount requires 'program_id'"
    return None


def guard_account(account: Account, command: Command) -> Reject | None:
    """What is refused of an existing account before its version is checked."""
    if account.status == DELETED:
        return Reject(DELETED_REASON, f"account {command.aggregate_id!r} is deleted")
    program_id = command.fields.get(PROGRAM_ID)
    if program_id is not None and program_id != account.program_id:
        return Reject(INVALID_COMMAND, f"program_id {program_id!r} is not the account's program {account.program_id!r}")
    return None


def decide_account(account: Account | None, command: Command) -> NewEvent | Reject:
    """The transition table (existence, deletion, program and version are checked before)."""
    if account is None:  # CreateAccount, the only type that creates
        return NewEvent(ACCOUNT_CREATED, command.data, {PROGRAM_ID: command.fields[PROGRAM_ID]})
    fields = {PROGRAM_ID: account.program_id}
    kind = command.type
    if kind == UPDATE_ACCOUNT:
        return NewEvent(ACCOUNT_UPDATED, {**account.data, **command.data}, fields)
    if kind == DEACTIVATE_ACCOUNT and account.status != ACTIVE:
        return Reject(INVALID_TRANSITION, f"cannot deactivate an account that is {account.status}")
    if kind == REACTIVATE_ACCOUNT and account.status != INACTIVE:
        return Reject(INVALID_TRANSITION, f"cannot reactivate an account that is {account.status}")
    return NewEvent(EVENT_FOR[kind], command.data, fields)


def evolve_account(account: Account | None, event: Event) -> Account:
    if account is None or event.type == ACCOUNT_CREATED:
        return Account(program_id=event.fields[PROGRAM_ID], status=ACTIVE, data=event.data)
    if event.type == ACCOUNT_UPDATED:
        return Account(program_id=account.program_id, status=account.status, data=event.data)
    return Account(program_id=account.program_id, status=STATUS_AFTER[event.type], data=account.data)


ACCOUNTS: Domain[Account] = Domain(
    name="accounts",
    noun="account",
    command_model=CommandIn,
    command_types=COMMAND_TYPES,
    creates=frozenset({CREATE_ACCOUNT}),
    event_types=EVENT_TYPES,
    topics=DomainTopics(
        commands=ACCOUNT_COMMANDS, events=ACCOUNT_EVENTS, rejections=ACCOUNT_REJECTIONS, command_batches=ACCOUNT_COMMAND_BATCHES
    ),
    decide=decide_account,
    evolve=evolve_account,
    state_to_json=account_to_json,
    state_from_json=account_from_json,
    aggregate_id_field="account_id",
    message_id_field="account_id",
    command_fields=(PROGRAM_ID,),
    check_command=check_account_command,
    guard=guard_account,
    reasons=ACCOUNT_REASONS,
)


def account_json(aggregate_id: str, version: int, account: Account) -> dict[str, Any]:
    """GET /accounts/{account_id}."""
    return {"account_id": aggregate_id, "program_id": account.program_id, "status": account.status, "version": version}
