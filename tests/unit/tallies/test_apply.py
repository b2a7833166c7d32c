"""The second hop's per-batch bookkeeping without Kafka: changes and logins are read
against the batch's own earlier rows, replays write nothing, and count moves are kept
in order to be applied once the rows are written."""

from __future__ import annotations

from types import SimpleNamespace

from services.tallies.app import BatchWrites, TalliesService
from services.tallies.domain import ACTIVE, INACTIVE, AccountChange, Membership
from services.tallies.state import ProgramCounts, decode_membership, encode_membership, membership_key


class Store:
    def __init__(self, rows: dict[tuple[int, bytes], bytes] | None = None) -> None:
        self.rows = rows or {}

    def get(self, partition: int, key: bytes) -> bytes | None:
        return self.rows.get((partition, key))


def service(memberships: Store, logins: Store) -> TalliesService:
    return SimpleNamespace(memberships_store=memberships, logins_store=logins)  # type: ignore[return-value]


def test_changes_in_one_batch_see_each_other_and_replays_write_nothing() -> None:
    stored = {(2, membership_key("P", "old")): encode_membership(Membership(ACTIVE, 3))}
    svc = service(Store(stored), Store())
    writes = BatchWrites()
    for change in (
        AccountChange("a", "P", "AccountCreated", 1),
        AccountChange("a", "P", "AccountDeactivated", 2),
        AccountChange("a", "P", "AccountCreated", 1),  # a replay within the batch
        AccountChange("old", "P", "AccountUpdated", 3),  # a replay of a stored version
        AccountChange("old", "P", "AccountDeactivated", 4),
    ):
        TalliesService.apply_change(svc, writes, 2, change)
    assert {k: decode_membership(v) for k, v in writes.memberships.items()} == {
        (2, membership_key("P", "a")): Membership(INACTIVE, 2),
        (2, membership_key("P", "old")): Membership(INACTIVE, 4),
    }
    assert writes.moves == [(2, "P", None, ACTIVE), (2, "P", ACTIVE, INACTIVE), (2, "P", ACTIVE, INACTIVE)]
    counts = ProgramCounts()
    counts.rebuild({2: [(membership_key("P", "old"), stored[(2, membership_key("P", "old"))])]})
    for move in writes.moves:
        counts.move(*move)
    assert counts.get(2, "P") == (0, 2)
    assert writes.programs == {"P"}


def test_logins_keep_the_largest_ts_across_the_batch_and_the_table() -> None:
    svc = service(Store(), Store({(1, b"P"): b"50"}))
    writes = BatchWrites()
    TalliesService.apply_login(svc, writes, 1, "P", 40)
    assert writes.last_logins == {} and writes.programs == set()
    TalliesService.apply_login(svc, writes, 1, "P", 70)
    TalliesService.apply_login(svc, writes, 1, "P", 60)
    assert writes.last_logins == {(1, b"P"): b"70"} and writes.programs == {"P"}
