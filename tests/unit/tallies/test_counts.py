"""The in-memory counts after a rebalance: a partition whose rows only this instance wrote
since it was counted keeps its counts; one whose copy took rows from elsewhere (a restore, a
standby's reading) is counted again; a partition never counted is never taken for counted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from services.tallies.app import TalliesService
from services.tallies.domain import Membership
from services.tallies.state import ProgramCounts, encode_membership, membership_key
from shared.accounts import ACTIVE
from shared.engine import partition_for
from shared.engine._rocksdb import PartitionWrite
from shared.engine.testing import TopologyDriver
from shared.settings import Settings
from tests.support.accounts import event

PARTITIONS = 4


def rows(*accounts: str) -> list[tuple[bytes, bytes]]:
    return sorted((membership_key("P", a), encode_membership(Membership(ACTIVE, 1))) for a in accounts)


def test_counts_kept_only_where_the_copy_did_not_move_past_them() -> None:
    counts = ProgramCounts()
    counts.rebuild({0: rows("a"), 1: rows("b", "c")}, applied={0: 10, 1: 20})
    assert counts.current(0, 10) and counts.current(1, 20)
    counts.move(0, "P", None, ACTIVE)
    counts.note_applied(0, 11)  # this instance's own write, the counts moved with it
    assert counts.current(0, 11) and not counts.current(0, 10)
    assert not counts.current(1, 25)  # rows arrived from elsewhere
    read = counts.rebuild({1: rows("b", "c", "d")}, keep=[0], applied={0: 11, 1: 25})
    assert read == 3
    assert counts.get(0, "P") == (2, 0) and counts.get(1, "P") == (3, 0)
    assert counts.current(0, 11) and counts.current(1, 25)


def test_a_partition_moved_before_it_was_ever_counted_is_not_taken_for_counted() -> None:
    counts = ProgramCounts()
    counts.move(2, "P", None, ACTIVE)  # processed before the first count (partial counts)
    counts.note_applied(2, 5)
    assert not counts.current(2, 5)
    counts.rebuild({}, keep=[2], applied={2: 5})
    assert not counts.holds(2)  # forgotten, not kept: the next count reads it whole


@pytest.fixture
def tallies(tmp_path: Path) -> Iterator[tuple[TalliesService, TopologyDriver]]:
    service = TalliesService(Settings(data_dir=tmp_path, topic_partitions=PARTITIONS))
    service.by_program.owned_partitions = lambda: set(range(PARTITIONS))  # type: ignore[method-assign]
    with TopologyDriver(service.engine) as driver:
        yield service, driver


def create(service: TalliesService, driver: TopologyDriver, account: str, program: str) -> None:
    driver.send(service.topics.account_events, account.encode(), orjson.dumps(event(account, program, "AccountCreated", 1)))


def test_a_rebalance_recounts_only_the_partition_restored_into(
    tallies: tuple[TalliesService, TopologyDriver], caplog: pytest.LogCaptureFixture
) -> None:
    service, driver = tallies
    for n in range(6):
        create(service, driver, f"a{n}", f"P{n}")
    driver.process()
    driver.run(service.by_program.rebuild_counts())  # the first count: every partition
    create(service, driver, "b0", "P0")  # processed on: the counts move with the rows
    driver.process()
    caplog.set_level("INFO", logger="services.tallies.handlers.by_program")
    driver.run(service.by_program.rebuild_counts())
    assert "counted 0 memberships in 0 of 4 owned partitions" in caplog.text
    assert service.by_program.tally("P0") is not None and service.by_program.tally("P0")["numberActive"] == 2  # type: ignore[index]

    # Rows restored into P0's partition from its changelog (written by another owner meanwhile).
    partition = partition_for("P0", PARTITIONS)
    store = service.memberships_store
    write = PartitionWrite(store.db(partition))
    write.put(membership_key("P0", "from-elsewhere"), encode_membership(Membership(ACTIVE, 1)))
    write.set_persisted_offset((store.applied_offset(partition) or 0) + 7)
    write.write()
    caplog.clear()
    driver.run(service.by_program.rebuild_counts())
    assert "in 1 of 4 owned partitions" in caplog.text
    assert service.by_program.tally("P0")["numberActive"] == 3  # type: ignore[index]
    assert all(service.counts.current(p, store.applied_offset(p)) for p in range(PARTITIONS))
