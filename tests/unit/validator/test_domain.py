"""The decision function, without Kafka: every row of the transition table, version
conflicts, malformed commands, idempotency, and batches deciding n+1 after n."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.validator.domain import ACCOUNTS, Account
from shared import domain as api
from shared.accounts import ACTIVE, DELETED, INACTIVE
from shared.domain import (
    EVENT_ID_NAMESPACE,
    Accepted,
    Aggregate,
    BatchPlan,
    Command,
    Duplicate,
    MalformedCommand,
    Outcome,
    OutcomeCode,
    Rejected,
    Row,
    event_id_for,
)

AccountState = Row[Account]


def decide(current: Aggregate[Account] | None, seen: dict[str, OutcomeCode], command: Command) -> Outcome:
    return api.decide(ACCOUNTS, current, seen, command)


def parse_command(obj: dict[str, Any], *, default_issued_at: int) -> Command:
    return api.parse_command(ACCOUNTS, obj, default_issued_at=default_issued_at)


def plan_batch(commands: list[Command], load: Any, history_limit: int) -> BatchPlan[Account]:
    return api.plan_batch(ACCOUNTS, commands, load, history_limit)


def cmd(type_: str, command_id: str = "c", account_id: str = "a1", program_id: str | None = None, **kw: Any) -> Command:
    return Command(
        command_id=command_id,
        aggregate_id=account_id,
        type=type_,
        issued_at=kw.pop("issued_at", 1000),
        fields={"program_id": program_id},
        **kw,
    )


def account(status: str, version: int = 3, data: dict[str, Any] | None = None) -> Aggregate[Account]:
    return Aggregate("a1", version, Account(program_id="p1", status=status, data=data or {"name": "n"}))


def accepted(outcome: object) -> Accepted[Account]:
    assert isinstance(outcome, Accepted), outcome
    return outcome


def rejected(outcome: object, reason: str) -> Rejected:
    assert isinstance(outcome, Rejected), outcome
    assert outcome.rejection.reason == reason, outcome.rejection
    return outcome


# -- the transition table: (command, state) -> event type and status, or reason -------------

NEVER = None
TABLE: list[tuple[str, str | None, str | None, str | None]] = [
    # command,            state before,  event (None: rejected), status after / reason
    ("CreateAccount", NEVER, "AccountCreated", ACTIVE),
    ("CreateAccount", ACTIVE, None, "ALREADY_EXISTS"),
    ("CreateAccount", INACTIVE, None, "ALREADY_EXISTS"),
    ("CreateAccount", DELETED, None, "ALREADY_EXISTS"),
    ("UpdateAccount", NEVER, None, "NOT_FOUND"),
    ("UpdateAccount", ACTIVE, "AccountUpdated", ACTIVE),
    ("UpdateAccount", INACTIVE, "AccountUpdated", INACTIVE),
    ("UpdateAccount", DELETED, None, "DELETED"),
    ("DeactivateAccount", NEVER, None, "NOT_FOUND"),
    ("DeactivateAccount", ACTIVE, "AccountDeactivated", INACTIVE),
    ("DeactivateAccount", INACTIVE, None, "INVALID_TRANSITION"),
    ("DeactivateAccount", DELETED, None, "DELETED"),
    ("ReactivateAccount", NEVER, None, "NOT_FOUND"),
    ("ReactivateAccount", ACTIVE, None, "INVALID_TRANSITION"),
    ("ReactivateAccount", INACTIVE, "AccountReactivated", ACTIVE),
    ("ReactivateAccount", DELETED, None, "DELETED"),
    ("DeleteAccount", NEVER, None, "NOT_FOUND"),
    ("DeleteAccount", ACTIVE, "AccountDeleted", DELETED),
    ("DeleteAccount", INACTIVE, "AccountDeleted", DELETED),
    ("DeleteAccount", DELETED, None, "DELETED"),
]


@pytest.mark.parametrize(("command_type", "before", "event_type", "after"), TABLE)
def test_transition_table(command_type: str, before: str | None, event_type: str | None, after: str) -> None:
    current = account(before) if before is not None else None
    program = "p1" if command_type == "CreateAccount" else None
    outcome = decide(current, {}, cmd(command_type, program_id=program))
    if event_type is None:
        rej = rejected(outcome, after).rejection
        assert rej.command_id == "c" and rej.aggregate_id == "a1" and rej.detail
        assert rej.current_version == (current.version if current else None)
        return
    acc = accepted(outcome)
    expected_version = current.version + 1 if current else 1
    assert acc.event.type == event_type
    assert acc.event.version == expected_version
    assert acc.aggregate.state.status == after and acc.aggregate.version == expected_version
    assert acc.event.fields["program_id"] == "p1" and acc.aggregate.state.program_id == "p1"


def test_created_event_has_every_field() -> None:
    outcome = accepted(decide(None, {}, cmd("CreateAccount", program_id="p9", data={"name": "Ann"}, issued_at=1234)))
    assert ACCOUNTS.event_json(outcome.event) == {
        "event_id": event_id_for("a1", "c"),
        "command_id": "c",
        "type": "AccountCreated",
        "account_id": "a1",
        "program_id": "p9",
        "version": 1,
        "occurred_at": 1234,
        "data": {"name": "Ann"},
    }
    assert outcome.aggregate == Aggregate("a1", 1, Account(program_id="p9", status=ACTIVE, data={"name": "Ann"}))


def test_update_merges_data_into_the_account_and_the_event() -> None:
    before = account(ACTIVE, data={"name": "Ann", "email": "a@x"})
    outcome = accepted(decide(before, {}, cmd("UpdateAccount", data={"email": "b@x", "plan": "gold"})))
    assert outcome.event.data == {"name": "Ann", "email": "b@x", "plan": "gold"}
    assert outcome.aggregate.state.data == {"name": "Ann", "email": "b@x", "plan": "gold"}


def test_status_changes_keep_the_account_data() -> None:
    before = account(ACTIVE, data={"name": "Ann"})
    outcome = accepted(decide(before, {}, cmd("DeactivateAccount", data={"reason": "asked"})))
    assert outcome.event.data == {"reason": "asked"}
    assert outcome.aggregate.state.data == {"name": "Ann"}


def test_event_id_is_derived_from_the_command() -> None:
    one = accepted(decide(None, {}, cmd("CreateAccount", program_id="p1")))
    again = accepted(decide(None, {}, cmd("CreateAccount", program_id="p1")))
    other = accepted(decide(None, {}, cmd("CreateAccount", command_id="c2", program_id="p1")))
    assert one.event == again.event
    assert one.event.event_id != other.event.event_id
    assert event_id_for("a1", "c") != event_id_for("a2", "c")


@given(st.text(max_size=40), st.text(max_size=40))
def test_event_ids_are_the_uuid5_of_account_and_command(account_id: str, command_id: str) -> None:
    # The ids events already carry must not change: they are how readers recognise a repeat.
    expected = uuid.uuid5(EVENT_ID_NAMESPACE, f"{account_id}\x00{command_id}")
    assert event_id_for(account_id, command_id) == str(expected)


# -- expected_version ----------------------------------------------------------------------------


@pytest.mark.parametrize("command_type", ["UpdateAccount", "DeactivateAccount", "DeleteAccount"])
def test_expected_version_must_equal_current(command_type: str) -> None:
    current = account(ACTIVE, version=4)
    ok = decide(current, {}, cmd(command_type, expected_version=4))
    assert accepted(ok).event.version == 5
    for stale in (0, 3, 5):
        rej = rejected(decide(current, {}, cmd(command_type, expected_version=stale)), "VERSION_CONFLICT").rejection
        assert rej.current_version == 4
        assert str(stale) in rej.detail


def test_create_expected_version_zero_means_new() -> None:
    assert accepted(decide(None, {}, cmd("CreateAccount", program_id="p1", expected_version=0))).event.version == 1
    rej = rejected(decide(None, {}, cmd("CreateAccount", program_id="p1", expected_version=1)), "VERSION_CONFLICT")
    assert rej.rejection.current_version is None


def test_checks_run_in_the_documented_order() -> None:
    # existence and deletion come before the version check
    rejected(decide(None, {}, cmd("UpdateAccount", expected_version=9)), "NOT_FOUND")
    rejected(decide(account(DELETED), {}, cmd("UpdateAccount", expected_version=9)), "DELETED")
    rejected(decide(account(ACTIVE), {}, cmd("CreateAccount", program_id="p1", expected_version=9)), "ALREADY_EXISTS")
    # the version check comes before the transition check
    rejected(decide(account(INACTIVE, version=3), {}, cmd("DeactivateAccount", expected_version=2)), "VERSION_CONFLICT")
    rejected(decide(account(INACTIVE, version=3), {}, cmd("DeactivateAccount", expected_version=3)), "INVALID_TRANSITION")


def test_program_id_of_another_program_is_invalid() -> None:
    rej = rejected(decide(account(ACTIVE), {}, cmd("UpdateAccount", program_id="p2")), "INVALID_COMMAND")
    assert "p2" in rej.rejection.detail
    accepted(decide(account(ACTIVE), {}, cmd("UpdateAccount", program_id="p1")))


# -- idempotency -----------------------------------------------------------------------------------


def test_a_seen_command_id_is_a_duplicate_with_its_original_outcome() -> None:
    current = account(ACTIVE, version=2)
    out = decide(current, {"c": 2}, cmd("UpdateAccount"))
    assert out == Duplicate(command_id="c", aggregate_id="a1", original=2)
    # the same id stays a duplicate whatever the state became, and whatever else it now says
    assert decide(account(DELETED, version=7), {"c": 2}, cmd("DeleteAccount")) == Duplicate("c", "a1", 2)
    assert decide(None, {"c": "NOT_FOUND"}, cmd("CreateAccount", program_id="p1")) == Duplicate("c", "a1", "NOT_FOUND")


def test_history_keeps_the_newest_ids_up_to_its_limit() -> None:
    state = AccountState()
    for i in range(5):
        state.remember(f"c{i}", i + 1, limit=3)
    assert list(state.history) == ["c2", "c3", "c4"]


# -- parsing --------------------------------------------------------------------------------------


def test_parse_a_full_command() -> None:
    obj = {
        "command_id": "c",
        "type": "CreateAccount",
        "account_id": "a",
        "program_id": "p",
        "expected_version": None,
        "data": {"k": 1},
        "issued_at": 5,
    }
    c = parse_command(obj, default_issued_at=99)
    assert c == Command(
        command_id="c", aggregate_id="a", type="CreateAccount", fields={"program_id": "p"}, data={"k": 1}, issued_at=5
    )
    assert c.invalid is None and ACCOUNTS.command_json(c) == obj


def test_parse_defaults() -> None:
    c = parse_command({"command_id": "c", "type": "UpdateAccount", "account_id": "a"}, default_issued_at=99)
    assert c.invalid is None and c.issued_at == 99 and c.data == {} and c.fields["program_id"] is None


@pytest.mark.parametrize(
    "obj",
    [
        {"type": "UpdateAccount", "account_id": "a"},
        {"command_id": "c", "type": "UpdateAccount"},
        {"command_id": 7, "type": "UpdateAccount", "account_id": "a"},
        {"command_id": "c", "type": "UpdateAccount", "account_id": ["a"]},
        {"command_id": "", "type": "UpdateAccount", "account_id": "a"},
    ],
)
def test_unanswerable_commands_are_malformed(obj: dict[str, Any]) -> None:
    with pytest.raises(MalformedCommand):
        parse_command(obj, default_issued_at=0)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"type": "Explode"}, "unknown command type"),
        ({"type": None}, "unknown command type"),
        ({"expected_version": "3"}, "expected_version"),
        ({"expected_version": -1}, "expected_version"),
        ({"expected_version": True}, "expected_version"),
        ({"data": [1, 2]}, "data"),
        ({"issued_at": "yesterday"}, "issued_at"),
        ({"program_id": 5}, "program_id"),
        ({"program_id": "p\x00q"}, "NUL"),
        ({"type": "CreateAccount"}, "requires 'program_id'"),
    ],
)
def test_invalid_commands_are_rejected_as_invalid_command(extra: dict[str, Any], fragment: str) -> None:
    obj = {"command_id": "c", "type": "UpdateAccount", "account_id": "a1", **extra}
    c = parse_command(obj, default_issued_at=0)
    assert c.invalid is not None and fragment in c.invalid
    rej = rejected(decide(account(ACTIVE), {}, c), "INVALID_COMMAND").rejection
    assert rej.command_id == "c" and rej.aggregate_id == "a1" and fragment in rej.detail


# -- batches ------------------------------------------------------------------------------------------


def test_batch_decides_each_command_against_the_one_before() -> None:
    commands = [
        cmd("CreateAccount", "c1", program_id="p1"),
        cmd("UpdateAccount", "c2", expected_version=1, data={"x": 1}),
        cmd("DeactivateAccount", "c3", expected_version=2),
        cmd("UpdateAccount", "c4", expected_version=2),  # stale
        cmd("ReactivateAccount", "c5"),
        cmd("UpdateAccount", "c2", expected_version=1),  # duplicate of c2
        cmd("DeleteAccount", "c6"),
        cmd("UpdateAccount", "c7"),
        cmd("CreateAccount", "c1", program_id="p1"),  # duplicate of c1
    ]
    loads: list[str] = []

    def load(account_id: str) -> AccountState | None:
        loads.append(account_id)
        return None

    plan = plan_batch(commands, load, history_limit=100)
    summary = [
        o.event.type if isinstance(o, Accepted) else o.rejection.reason if isinstance(o, Rejected) else "dup"
        for o in plan.outcomes
    ]
    assert summary == [
        "AccountCreated",
        "AccountUpdated",
        "AccountDeactivated",
        "VERSION_CONFLICT",
        "AccountReactivated",
        "dup",
        "AccountDeleted",
        "DELETED",
        "dup",
    ]
    versions = [o.event.version for o in plan.outcomes if isinstance(o, Accepted)]
    assert versions == [1, 2, 3, 4, 5]
    assert loads == ["a1"]
    state = plan.states["a1"]
    assert state.aggregate is not None and state.aggregate.state.status == DELETED and state.aggregate.version == 5
    assert state.history == {"c1": 1, "c2": 2, "c3": 3, "c4": "VERSION_CONFLICT", "c5": 4, "c6": 5, "c7": "DELETED"}


def test_batch_starts_from_the_stored_state_and_keeps_accounts_apart() -> None:
    stored = {"a1": AccountState(aggregate=account(INACTIVE, version=3), history={"old": 3})}
    commands = [
        cmd("ReactivateAccount", "r1"),
        cmd("CreateAccount", "k1", account_id="b2", program_id="p2"),
        cmd("DeactivateAccount", "old"),
        cmd("UpdateAccount", "k2", account_id="b2", expected_version=1),
    ]
    plan = plan_batch(commands, stored.get, history_limit=100)
    kinds = [type(o).__name__ for o in plan.outcomes]
    assert kinds == ["Accepted", "Accepted", "Duplicate", "Accepted"]
    assert accepted(plan.outcomes[0]).event.version == 4
    assert accepted(plan.outcomes[3]).event.version == 2
    assert set(plan.states) == {"a1", "b2"}


def test_a_batch_of_only_duplicates_changes_no_state() -> None:
    stored = {"a1": AccountState(aggregate=account(ACTIVE, version=1), history={"c1": 1})}
    plan = plan_batch([cmd("CreateAccount", "c1", program_id="p1")], stored.get, history_limit=10)
    assert isinstance(plan.outcomes[0], Duplicate) and plan.states == {}


def test_rejections_of_unknown_accounts_are_remembered() -> None:
    plan = plan_batch([cmd("UpdateAccount", "u1")], lambda _: None, history_limit=10)
    rejected(plan.outcomes[0], "NOT_FOUND")
    assert plan.states["a1"].aggregate is None and plan.states["a1"].history == {"u1": "NOT_FOUND"}
    # the same id later, after the account was created, is still the same NOT_FOUND
    again = plan_batch(
        [cmd("CreateAccount", "c1", program_id="p1"), cmd("UpdateAccount", "u1")], lambda _: plan.states["a1"], history_limit=10
    )
    assert isinstance(again.outcomes[1], Duplicate) and again.outcomes[1].original == "NOT_FOUND"


def test_unstorable_account_ids_are_answered_without_state() -> None:
    c = parse_command({"command_id": "c", "type": "UpdateAccount", "account_id": "a\x00b"}, default_issued_at=0)
    assert not c.storable
    plan = plan_batch([c], lambda _: pytest.fail("must not load"), history_limit=10)
    rejected(plan.outcomes[0], "INVALID_COMMAND")
    assert plan.states == {}
