"""The reference model of the chaos run: what the public contract says the fleet must
produce, computed from the contract's rules alone (never from the services' code).

Commands are applied per account in the order the load wrote them (the load writes an
account's next command only once the previous one is acknowledged, so that is the order
in its partition). Where the contract leaves the choice open between two rejection
reasons (a command both stale and invalid, say) every reason it allows is accepted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

CREATE, UPDATE, DEACTIVATE, REACTIVATE, DELETE = (
    "CreateAccount",
    "UpdateAccount",
    "DeactivateAccount",
    "ReactivateAccount",
    "DeleteAccount",
)
COMMAND_TYPES = (CREATE, UPDATE, DEACTIVATE, REACTIVATE, DELETE)
EVENT_TYPES = {
    CREATE: "AccountCreated",
    UPDATE: "AccountUpdated",
    DEACTIVATE: "AccountDeactivated",
    REACTIVATE: "AccountReactivated",
    DELETE: "AccountDeleted",
}
ACTIVE, INACTIVE, DELETED = "active", "inactive", "deleted"
#: The error classes the project's docs give ``max_attempts: 1`` (parked at once).
PARK_AT_ONCE_CLASSES = frozenset({"ValidationError", "InvalidInput", "InvalidCommand", "InvalidEvent", "DecodeError"})


@dataclass
class Account:
    account_id: str
    program_id: str
    status: str
    version: int


@dataclass(frozen=True)
class ExpectedEvent:
    account_id: str
    program_id: str
    version: int
    type: str
    command_id: str


@dataclass(frozen=True)
class Outcome:
    """A command's outcome: its event, or the rejection reasons the contract allows."""

    command_id: str
    account_id: str
    event: ExpectedEvent | None = None
    reasons: frozenset[str] = frozenset()

    @property
    def accepted(self) -> bool:
        return self.event is not None


def _state_reasons(type_: str, account: Account | None) -> frozenset[str]:
    """Why the account's state refuses ``type_`` (empty: it allows it)."""
    if type_ == CREATE:
        if account is None:
            return frozenset()
        return frozenset({"ALREADY_EXISTS", "DELETED"}) if account.status == DELETED else frozenset({"ALREADY_EXISTS"})
    if account is None:
        return frozenset({"NOT_FOUND"})
    if account.status == DELETED:
        # Deactivating or reactivating a deleted account is both an invalid transition and deleted.
        return frozenset({"DELETED"}) if type_ in (UPDATE, DELETE) else frozenset({"DELETED", "INVALID_TRANSITION"})
    if type_ == DEACTIVATE and account.status != ACTIVE:
        return frozenset({"INVALID_TRANSITION"})
    if type_ == REACTIVATE and account.status != INACTIVE:
        return frozenset({"INVALID_TRANSITION"})
    return frozenset()


_STATUS_AFTER = {CREATE: ACTIVE, DEACTIVATE: INACTIVE, REACTIVATE: ACTIVE, DELETE: DELETED}


@dataclass
class Model:
    accounts: dict[str, Account] = field(default_factory=dict)
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    #: Every event the fleet must write, per account, in version order.
    events: dict[str, list[ExpectedEvent]] = field(default_factory=dict)
    #: Every account a command named (accounts never created included: GET /accounts answers 404).
    named_accounts: set[str] = field(default_factory=set)
    last_login: dict[str, int] = field(default_factory=dict)
    programs: set[str] = field(default_factory=set)

    def apply(self, command: dict[str, Any]) -> Outcome:
        """Apply one command (a dict in the contract's Command shape); its outcome."""
        command_id, account_id, type_ = command["command_id"], command["account_id"], command["type"]
        self.named_accounts.add(account_id)
        seen = self.outcomes.get(command_id)
        if seen is not None:
            if seen.account_id != account_id:
                raise ValueError(f"command id {command_id!r} reused for another account: the load must not do that")
            return seen  # the same outcome again, and no new event
        if type_ not in COMMAND_TYPES:
            raise ValueError(f"the model has no rule for command type {type_!r}")
        account = self.accounts.get(account_id)
        reasons = set(_state_reasons(type_, account))
        expected = command.get("expected_version")
        current = account.version if account is not None else 0
        if expected is not None and expected != current:
            reasons.add("VERSION_CONFLICT")
        if reasons:
            outcome = Outcome(command_id, account_id, reasons=frozenset(reasons))
        else:
            if account is None:
                account = Account(account_id, command["program_id"], ACTIVE, 0)
                self.accounts[account_id] = account
                self.programs.add(account.program_id)
            account.version += 1
            account.status = _STATUS_AFTER.get(type_, account.status)
            event = ExpectedEvent(account_id, account.program_id, account.version, EVENT_TYPES[type_], command_id)
            self.events.setdefault(account_id, []).append(event)
            outcome = Outcome(command_id, account_id, event=event)
        self.outcomes[command_id] = outcome
        return outcome

    def login(self, program_id: str, ts: int) -> None:
        self.programs.add(program_id)
        self.last_login[program_id] = max(ts, self.last_login.get(program_id, ts))

    def tallies(self) -> dict[str, dict[str, Any]]:
        """Every program's tally as the contract defines it."""
        active: dict[str, int] = {}
        inactive: dict[str, int] = {}
        for account in self.accounts.values():
            if account.status == ACTIVE:
                active[account.program_id] = active.get(account.program_id, 0) + 1
            elif account.status == INACTIVE:
                inactive[account.program_id] = inactive.get(account.program_id, 0) + 1
        return {
            p: {
                "program_id": p,
                "numberActive": active.get(p, 0),
                "numberInactive": inactive.get(p, 0),
                "lastLogin": self.last_login.get(p),
            }
            for p in self.programs
        }

    def all_events(self) -> Iterable[ExpectedEvent]:
        for events in self.events.values():
            yield from events


@dataclass(frozen=True)
class DeadLetterFate:
    """Where one dead letter the load wrote must end: ``topic`` is its retry topic or the parking lot."""

    parked: bool
    topic: str
    attempt: int


def dead_letter_fate(headers: dict[str, str], *, max_attempts: int, default_retry_topic: str, parking_lot: str) -> DeadLetterFate:
    """The contract: missing headers mean attempt 1 and the default retry topic; past the
    maximum attempts (the project's docs: the policy's, 1 for the classes that cannot get
    better) a dead letter is parked, otherwise redelivered to its retry topic."""
    attempt = int(headers.get("dlq.attempt", "1"))
    limit = 1 if headers.get("dlq.error.class") in PARK_AT_ONCE_CLASSES else max_attempts
    if attempt >= limit:
        return DeadLetterFate(parked=True, topic=parking_lot, attempt=attempt)
    return DeadLetterFate(parked=False, topic=headers.get("dlq.retry.topic") or default_retry_topic, attempt=attempt)
