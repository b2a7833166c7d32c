"""The second hop's per-batch bookkeeping without Kafka: changes and logins are read
against the batch's own earlier rows, replays write nothing, and count moves are kept
in order to be applied once the rows are written."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from services.tallies.domain import PROJECTION, Membership
from services.tallies.handlers.by_program import ByProgram
from services.tallies.state import ProgramCounts, decode_membership, encode_membership, membership_key
from shared.accounts import ACTIVE, INACTIVE
from shared.engine import InputBatch
from shared.projection import Change


class Store:
    def __init__(self, rows: dict[tuple[int, bytes], bytes] | None = None) -> None:
        self.rows = rows or {}

    def get(self, partition: int, key: bytes) -> bytes | None:
        return self.rows.get((partition, key))

    def db(self, partition: int) -> dict[bytes, bytes]:
        return {key: value for (p, key), value in self.rows.items() if p == partition}


def service(memberships: Store, logins: Store) -> ByProgram:
    return SimpleNamespace(memberships_store=memberships, logins_store=logins, evolve=PROJECTION.evolve)  # type: ignore[return-value]


def test_changes_in_one_batch_see_each_other_and_replays_write_nothing() -> None:
    stored = {(2, membership_key("P", "old")): encode_membership(Membership(ACTIVE, 3))}
    memberships = Store(stored)
    svc = service(memberships, Store())
    batch = InputBatch("by-program", 2, [])
    moves: list[tuple[str, str | None, str]] = []
    programs: set[str] = set()
    for change in (
        Change("a", "P", "AccountCreated", 1),
        Change("a", "P", "AccountDeactivated", 2),
        Change("a", "P", "AccountCreated", 1),  # a replay within the batch
        Change("old", "P", "AccountUpdated", 3),  # a replay of a stored version
        Change("old", "P", "AccountDeactivated", 4),
    ):
        ByProgram.apply_change(svc, batch, change, moves, programs)
    rows = batch.rows[cast(Any, memberships)]
    assert {k: decode_membership(v) for k, v in rows.items() if v is not None} == {
        (2, membership_key("P", "a")): Membership(INACTIVE, 2),
        (2, membership_key("P", "old")): Membership(INACTIVE, 4),
    }
    assert moves == [("P", None, ACTIVE), ("P", ACTIVE, INACTIVE), ("P", ACTIVE, INACTIVE)]
    counts = ProgramCounts()
    counts.rebuild({2: [(membership_key("P", "old"), stored[(2, membership_key("P", "old"))])]})
    for program_id, before, after in moves:
        counts.move(2, program_id, before, after)
    assert counts.get(2, "P") == (0, 2)
    assert programs == {"P"}


def test_logins_keep_the_largest_ts_across_the_batch_and_the_table() -> None:
    logins = Store({(1, b"P"): b"50"})
    svc = service(Store(), logins)
    batch = InputBatch("by-program", 1, [])
    programs: set[str] = set()
    ByProgram.apply_login(svc, batch, "P", 40, programs)
    assert batch.rows == {} and programs == set()
    ByProgram.apply_login(svc, batch, "P", 70, programs)
    ByProgram.apply_login(svc, batch, "P", 60, programs)
    assert batch.rows[cast(Any, logins)] == {(1, b"P"): b"70"} and programs == {"P"}


def test_counts_kept_in_memory_answer_only_once_the_recovery_is_done() -> None:
    """A member removed while stopped rejoins with the counts of before the stop, while its rows
    are restored with what the others wrote meanwhile: until the recovery is done (and the
    counts rebuilt), a tally is counted from the rows, whose lag the copy reports."""
    rows = sorted(
        [
            (membership_key("P", "a"), encode_membership(Membership(ACTIVE, 1))),
            (membership_key("P", "b"), encode_membership(Membership(ACTIVE, 1))),  # written while it was stopped
        ]
    )
    recovered = [False]
    engine = SimpleNamespace(instance=SimpleNamespace(ready=lambda: recovered[0]))
    counts = ProgramCounts()
    counts.rebuild({2: rows[:1]})  # the counts of before the stop
    memberships = SimpleNamespace(items=lambda p, from_key=None: iter(rows))
    svc: Any = SimpleNamespace(counts=counts, engine=engine, memberships_store=memberships)
    svc._counts_current = lambda p: ByProgram._counts_current(svc, p)
    assert ByProgram._program_counts(svc, 2, "P") == (2, 0)
    recovered[0] = True  # the recovery's rebuild would have counted both; the counts answer from here on
    assert ByProgram._program_counts(svc, 2, "P") == (1, 0)
