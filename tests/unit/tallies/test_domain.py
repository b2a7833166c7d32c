from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.tallies.domain import (
    InvalidInput,
    Login,
    Membership,
    apply_change,
    count_delta,
    fold_program,
    parse_account_change,
    parse_login,
)
from shared.accounts import ACTIVE, DELETED, INACTIVE, UNKNOWN, AccountChange


def change(account: str, type_: str, version: int, program: str = "P") -> AccountChange:
    return AccountChange(account_id=account, program_id=program, type=type_, version=version)


@pytest.mark.parametrize(
    ("before", "type_", "after"),
    [
        (None, "AccountCreated", ACTIVE),
        (ACTIVE, "AccountUpdated", ACTIVE),
        (INACTIVE, "AccountUpdated", INACTIVE),
        (ACTIVE, "AccountDeactivated", INACTIVE),
        (INACTIVE, "AccountReactivated", ACTIVE),
        (ACTIVE, "AccountDeleted", DELETED),
        (INACTIVE, "AccountDeleted", DELETED),
        (None, "AccountUpdated", UNKNOWN),
    ],
)
def test_status_after_each_event(before: str | None, type_: str, after: str) -> None:
    current = Membership(before, 1) if before is not None else None
    result = apply_change(current, change("a", type_, 2))
    assert result == Membership(after, 2)


@pytest.mark.parametrize("version", [1, 2])
def test_replayed_or_older_version_changes_nothing(version: int) -> None:
    assert apply_change(Membership(INACTIVE, 2), change("a", "AccountReactivated", version)) is None


@pytest.mark.parametrize(
    ("before", "after", "delta"),
    [
        (None, ACTIVE, (1, 0)),
        (ACTIVE, INACTIVE, (-1, 1)),
        (INACTIVE, ACTIVE, (1, -1)),
        (ACTIVE, DELETED, (-1, 0)),
        (INACTIVE, DELETED, (0, -1)),
        (ACTIVE, ACTIVE, (0, 0)),
        (None, UNKNOWN, (0, 0)),
    ],
)
def test_count_delta(before: str | None, after: str, delta: tuple[int, int]) -> None:
    assert count_delta(before, after) == delta


def test_fold_program_counts_each_account_by_its_latest_status() -> None:
    changes = [
        change("a1", "AccountCreated", 1),
        change("a2", "AccountCreated", 1),
        change("a2", "AccountDeactivated", 2),
        change("a3", "AccountCreated", 1),
        change("a3", "AccountDeactivated", 2),
        change("a3", "AccountDeleted", 3),
        change("a4", "AccountCreated", 1),
        change("a4", "AccountDeactivated", 2),
        change("a4", "AccountReactivated", 3),
        change("a4", "AccountUpdated", 4),
    ]
    logins = [Login("a1", "P", 5), Login("a2", "P", 9), Login("a1", "P", 7)]
    tally = fold_program("P", changes, logins)
    assert tally.to_json() == {"program_id": "P", "numberActive": 2, "numberInactive": 1, "lastLogin": 9}


def test_fold_program_without_logins_has_null_last_login() -> None:
    assert fold_program("P", [change("a", "AccountCreated", 1)], []).lastLogin is None


@given(st.permutations(list(range(6))), st.lists(st.integers(min_value=0, max_value=5), max_size=10))
def test_duplicates_and_order_never_change_the_tally(order: list[int], dup_idx: list[int]) -> None:
    base = [
        change("a", "AccountCreated", 1),
        change("a", "AccountDeactivated", 2),
        change("b", "AccountCreated", 1),
        change("b", "AccountDeleted", 2),
        change("c", "AccountCreated", 1),
        change("c", "AccountUpdated", 2),
    ]
    noisy = [base[i] for i in order] + [base[i] for i in dup_idx]
    assert fold_program("P", noisy, []) == fold_program("P", base, [])
    assert fold_program("P", base, []).numberActive == 1
    assert fold_program("P", base, []).numberInactive == 1


def test_streaming_application_equals_fold_with_replays() -> None:
    """Applying in arrival order with replays interleaved gives the batch fold's answer."""
    rng = random.Random(7)
    history: list[AccountChange] = []
    for n in range(30):
        acc = f"a{n}"
        tails = [[], ["AccountDeactivated"], ["AccountDeactivated", "AccountReactivated"], ["AccountUpdated", "AccountDeleted"]]
        types = ["AccountCreated", *rng.choice(tails)]
        history += [change(acc, t, v) for v, t in enumerate(types, start=1)]
    arrivals = list(itertools.chain(history, rng.sample(history, 15)))
    members: dict[str, Membership] = {}
    active = inactive = 0
    for c in arrivals:
        before = members.get(c.account_id)
        after = apply_change(before, c)
        if after is None:
            continue
        members[c.account_id] = after
        da, di = count_delta(before.status if before else None, after.status)
        active, inactive = active + da, inactive + di
    folded = fold_program("P", history, [])
    assert (active, inactive) == (folded.numberActive, folded.numberInactive)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"type": "AccountCreated", "account_id": "a", "program_id": "P"}, "'version' must be an integer"),
        ({"type": "AccountCreated", "account_id": "a", "version": 1}, "'program_id' must be a non-empty string"),
        ({"type": "Bogus", "account_id": "a", "program_id": "P", "version": 1}, "unknown event type"),
        ({"type": "AccountCreated", "account_id": "a", "program_id": "P", "version": True}, "'version' must be an integer"),
        ({"type": "AccountCreated", "account_id": "a", "program_id": "P", "version": 0}, "'version' must be >= 1"),
    ],
)
def test_parse_account_change_rejects_bad_records(record: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_account_change(record)


def test_parse_login() -> None:
    assert parse_login({"account_id": "a", "program_id": "P", "ts": 12}) == Login("a", "P", 12)
    with pytest.raises(InvalidInput, match="'ts' must be an integer"):
        parse_login({"account_id": "a", "program_id": "P", "ts": "12"})
