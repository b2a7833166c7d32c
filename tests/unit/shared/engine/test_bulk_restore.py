"""The bulk restore's loop (``shared/engine/_restore.py``) on real rocksdict databases, reading
an in-memory changelog: tombstones delete, next-offset rows land in the engine family, the
persisted offset never covers a row not written yet, a cancellation (a new rebalance) leaves
rows and offset consistent, and a restore stopped by its budget goes on in the next round."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError, NotLeaderForPartitionError
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from faust.tables.recovery import RebalanceAgain
from rocksdict import Rdict

from shared.engine import _restore
from shared.engine._faust import RecoveryHooks
from shared.engine._restore import (
    ChangelogFetcher,
    ChangelogReader,
    FetchedPartition,
    PartitionTarget,
    RestoreResult,
    write_fetched,
)
from shared.engine._rocksdb import NEXT_OFFSET_PREFIX, engine_family, open_partition_db, persisted_offset, set_persisted_offset
from shared.metrics import REGISTRY
from shared.settings import Settings

TOPIC = "svc-table-changelog"
P0, P1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)


@dataclass(frozen=True)
class Record:
    offset: int
    key: bytes
    value: bytes | None


class InMemoryChangelog:
    """The consumer calls and fetches the bulk restore makes, answered from lists of records
    (offsets may skip, as in a compacted changelog). A fetch's batch begins one record before the
    position asked for, as a broker's record batch may. ``hold_at_fetch``: that fetch (1-based)
    waits until :attr:`release` is set, so a test can cancel the restore there."""

    def __init__(self, logs: Mapping[TopicPartition, list[Record]], per_fetch: int = 3, hold_at_fetch: int | None = None):
        self.logs = logs
        self.per_fetch = per_fetch
        self.fetches = 0
        self.hold_at_fetch = hold_at_fetch
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    def end(self, tp: TopicPartition) -> int:
        log = self.logs[tp]
        return log[-1].offset + 1 if log else 0

    async def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.end(tp) for tp in tps}

    async def fetch(self, positions: Mapping[TopicPartition, int]) -> list[FetchedPartition]:
        self.fetches += 1
        if self.fetches == self.hold_at_fetch:
            self.holding.set()
            await self.release.wait()
        out: list[FetchedPartition] = []
        for tp, position in positions.items():
            log = self.logs[tp]
            first = next((i for i, r in enumerate(log) if r.offset >= position), len(log))
            batch = log[max(0, first - 1) : first + self.per_fetch]
            out.append(FetchedPartition(tp, [batch], position, batch[-1].offset + 1 if first < len(log) else self.end(tp)))
        return out


class Partition:
    """A partition database as the engine opens it; each offset written is checked against the
    rows already there (the offset must never cover a row not written yet), and the rows must be
    in files by then (the bulk restore writes them without the WAL)."""

    def __init__(self, path: Path, log: list[Record]) -> None:
        self._db = open_partition_db(path)
        self.log = log
        self.offsets_written: list[int] = []

    def db(self) -> Rdict:
        return self._db

    def persisted_offset(self) -> int | None:
        return persisted_offset(self._db)

    def set_persisted_offset(self, offset: int) -> None:
        assert self.state() == expected_state(self.log, offset), f"offset {offset} written before its rows"
        for family in (self._db, engine_family(self._db)):
            memtables = ("rocksdb.num-entries-active-mem-table", "rocksdb.num-entries-imm-mem-tables")
            assert not any(family.property_int_value(p) for p in memtables), f"offset {offset} written before its rows' flush"
        set_persisted_offset(self._db, offset)
        self.offsets_written.append(offset)

    def state(self) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
        """(service rows, next-offset rows)."""
        engine = engine_family(self._db)
        rows = {cast(bytes, k): cast(bytes, v) for k, v in self._db.items()}
        engine_rows = {cast(bytes, k): cast(bytes, v) for k, v in engine.items() if cast(bytes, k).startswith(NEXT_OFFSET_PREFIX)}
        return rows, engine_rows


def expected_state(log: list[Record], up_to: int | None) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
    """Rows and next-offset rows after the records up to offset ``up_to`` (None: all of them)."""
    rows: dict[bytes, bytes] = {}
    engine_rows: dict[bytes, bytes] = {}
    for record in log:
        if up_to is not None and record.offset > up_to:
            break
        family = engine_rows if record.key.startswith(NEXT_OFFSET_PREFIX) else rows
        if record.value is None:
            family.pop(record.key, None)
        else:
            family[record.key] = record.value
    return rows, engine_rows


def history(partition: int, n: int) -> list[Record]:
    """Writes, overwrites, tombstones and next-offset rows, at offsets with compaction gaps."""
    out: list[Record] = []
    offset = 0
    for i in range(n):
        key = f"k{partition}-{i % 7}".encode()
        if i % 5 == 4:
            out.append(Record(offset, key, None))  # a tombstone
        elif i % 4 == 3:
            out.append(Record(offset, NEXT_OFFSET_PREFIX + f"input-{i % 2}".encode(), str(i).encode()))
        else:
            out.append(Record(offset, key, f"v{i}".encode()))
        offset += 2 if i % 6 == 5 else 1  # a gap: compacted away
    out.append(Record(offset, NEXT_OFFSET_PREFIX + b"input-0", None))  # a next-offset row deleted
    return out


def reader_over(changelog: InMemoryChangelog) -> ChangelogReader:
    reader = ChangelogReader(Settings())
    reader._consumer = cast(Any, changelog)  # the reader's consumer: the in-memory changelog
    reader.fetcher = changelog
    return reader


@pytest.fixture
def logs() -> dict[TopicPartition, list[Record]]:
    return {P0: history(0, 40), P1: history(1, 25)}


@pytest.fixture
def targets(tmp_path: Path, logs: dict[TopicPartition, list[Record]]) -> dict[TopicPartition, Partition]:
    return {tp: Partition(tmp_path / f"p{tp.partition}", log) for tp, log in logs.items()}


async def test_a_restore_applies_the_changelog_rows_to_their_families(
    logs: dict[TopicPartition, list[Record]], targets: dict[TopicPartition, Partition]
) -> None:
    result = await reader_over(InMemoryChangelog(logs)).restore(cast(Mapping[TopicPartition, PartitionTarget], targets), 1)

    assert result.records == sum(len(log) for log in logs.values())
    assert (result.partitions, result.left) == (2, 0)
    for tp, target in targets.items():
        rows, engine_rows = target.state()
        assert (rows, engine_rows) == expected_state(logs[tp], None)
        assert not any(k.startswith(b"k") for k in engine_rows) and not any(k.startswith(NEXT_OFFSET_PREFIX) for k in rows)
        assert NEXT_OFFSET_PREFIX + b"input-1" in engine_rows
        assert NEXT_OFFSET_PREFIX + b"input-0" not in engine_rows  # its tombstone is the last record
        if tp == P0:
            assert b"k0-4" not in rows and b"k0-3" in rows  # the last record but one deletes k0-4
        assert target.persisted_offset() == logs[tp][-1].offset
        # each offset after its rows' flush (checked as it was written), rising
        assert target.offsets_written == sorted(target.offsets_written)


async def test_each_checkpoint_flushes_the_rows_before_it_moves_the_offset(
    logs: dict[TopicPartition, list[Record]], targets: dict[TopicPartition, Partition], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_restore, "RESTORE_CHECKPOINT_S", 0.0)  # a checkpoint after every fetch
    await reader_over(InMemoryChangelog(logs)).restore(cast(Mapping[TopicPartition, PartitionTarget], targets), 1)

    for tp, target in targets.items():
        assert target.state() == expected_state(logs[tp], None)
        written = target.offsets_written
        assert written == sorted(set(written)) and len(written) > 1 and written[-1] == logs[tp][-1].offset


async def test_only_the_tail_past_the_persisted_offset_is_read(
    logs: dict[TopicPartition, list[Record]], targets: dict[TopicPartition, Partition]
) -> None:
    await reader_over(InMemoryChangelog(logs)).restore(cast(Mapping[TopicPartition, PartitionTarget], targets), 1)
    logs[P0].append(Record(logs[P0][-1].offset + 1, b"k0-new", b"late"))

    again = await reader_over(InMemoryChangelog(logs)).restore(cast(Mapping[TopicPartition, PartitionTarget], targets), 1)

    assert (again.records, again.partitions) == (1, 1)
    assert targets[P0].state() == expected_state(logs[P0], None)


async def test_a_cancelled_restore_leaves_rows_and_offset_consistent_and_the_next_one_finishes(
    logs: dict[TopicPartition, list[Record]], targets: dict[TopicPartition, Partition]
) -> None:
    changelog = InMemoryChangelog(logs, hold_at_fetch=4)
    restore = asyncio.ensure_future(reader_over(changelog).restore(cast(Mapping[TopicPartition, PartitionTarget], targets), 1))
    await asyncio.wait_for(changelog.holding.wait(), 10)
    restore.cancel()  # a new rebalance, while the restore waits for a fetch
    with pytest.raises(asyncio.CancelledError):
        await restore

    for tp, target in targets.items():
        offset = target.persisted_offset()
        assert offset is not None and offset < logs[tp][-1].offset  # part of the way
        assert target.state() == expected_state(logs[tp], offset)

    await reader_over(InMemoryChangelog(logs)).restore(cast(Mapping[TopicPartition, PartitionTarget], targets), 1)
    for tp, target in targets.items():
        assert target.state() == expected_state(logs[tp], None)
        assert target.persisted_offset() == logs[tp][-1].offset


async def test_a_restore_out_of_budget_says_how_many_partitions_are_left_and_the_next_round_goes_on(
    logs: dict[TopicPartition, list[Record]], targets: dict[TopicPartition, Partition]
) -> None:
    first = await reader_over(InMemoryChangelog(logs)).restore(
        cast(Mapping[TopicPartition, PartitionTarget], targets), 1, budget_s=0.0
    )
    assert first == RestoreResult(first.records, first.seconds, 2, left=2)

    rounds = 1
    result = first
    while result.left:
        result = await reader_over(InMemoryChangelog(logs)).restore(cast(Mapping[TopicPartition, PartitionTarget], targets), 1)
        rounds += 1
    assert rounds == 2
    for tp, target in targets.items():
        assert target.state() == expected_state(logs[tp], None)


async def test_a_round_ends_by_running_faust_s_recovery_steps_again() -> None:
    recovery = cast(Any, type("Recovery", (), {"signal_recovery_start": asyncio.Event()})())
    with pytest.raises(RebalanceAgain):
        RecoveryHooks.run_steps_again(recovery)
    assert recovery.signal_recovery_start.is_set()  # Faust's recovery task starts over on it


class StepsOfARecovery:
    """What :meth:`BulkRestoringRecovery._retrying_step` uses of Faust's recovery service."""

    app = object()
    _failed_steps = 0

    def __init__(self) -> None:
        self.signal_recovery_start = asyncio.Event()

    def run_steps_again(self) -> None:
        RecoveryHooks.run_steps_again(cast(Any, self))


async def test_a_broker_failure_in_a_recovery_step_runs_the_steps_again_instead_of_ending_the_worker() -> None:
    recovery = StepsOfARecovery()

    async def leader_moved() -> None:
        raise NotLeaderForPartitionError("svc-table-changelog[0]")

    labels = {"service": "", "reason": "NotLeaderForPartitionError"}
    retries = REGISTRY.get_sample_value("statefleet_restore_retries_total", labels)
    for failures in (1, 2):
        with pytest.raises(RebalanceAgain):  # Faust's recovery task starts over on it, rather than crashing
            await _restore.BulkRestoringRecovery._retrying_step(cast(Any, recovery), leader_moved(), "reading the ends")
        assert recovery.signal_recovery_start.is_set()
        assert recovery._failed_steps == failures  # the wait before the next try doubles
        recovery.signal_recovery_start.clear()
    after = REGISTRY.get_sample_value("statefleet_restore_retries_total", labels)
    assert (after or 0) - (retries or 0) == 2


async def test_a_failure_that_is_not_the_brokers_still_ends_the_recovery() -> None:
    recovery = StepsOfARecovery()

    async def broken_store() -> None:
        raise ValueError("a row that does not decode")

    with pytest.raises(ValueError, match="does not decode"):
        await _restore.BulkRestoringRecovery._retrying_step(cast(Any, recovery), broken_store(), "reading the ends")
    assert not recovery.signal_recovery_start.is_set()
    assert recovery._failed_steps == 0


class FlakyBroker:
    """An aiokafka client as :class:`ChangelogFetcher` uses it, over one partition: the first
    ``failures`` fetches fail with a connection error (a broker restarting), the next ones
    answer with one record batch of ``records`` from the offset asked for (a batch begins one
    record before it, as a broker's may)."""

    def __init__(self, records: list[Record], failures: int) -> None:
        self.records = records
        self.failures = failures
        self.metadata_updates = 0
        self.cluster = type("Cluster", (), {"leader_for_partition": staticmethod(lambda tp: 1)})()

    async def force_metadata_update(self) -> bool:
        self.metadata_updates += 1
        return True

    async def send(self, node: int, request: Any) -> Any:
        if self.failures:
            self.failures -= 1
            raise KafkaConnectionError("connection lost")
        ((topic, ((partition, offset, _max_bytes),)),) = request.topics
        builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1024 * 1024)
        for record in self.records[max(0, offset - 1) : offset + 3]:
            builder.append(record.offset, 0, record.key, record.value, [])
        message_set = bytes(builder.build())
        return type("Response", (), {"API_VERSION": 4, "topics": [(topic, [(partition, 0, 10, 10, [], message_set)])]})()


async def test_the_fetcher_fetches_again_after_a_connection_error_and_skips_records_before_its_position(tmp_path: Path) -> None:
    records = [Record(i, f"k{i}".encode(), f"v{i}".encode()) for i in range(10)]
    broker = FlakyBroker(records, failures=2)
    fetcher = ChangelogFetcher(cast(Any, type("Consumer", (), {"_client": broker})()), read_committed=True)

    assert await fetcher.fetch({P0: 4}) == []  # the broker is away: nothing, and the metadata read again
    assert await fetcher.fetch({P0: 4}) == []
    assert broker.metadata_updates == 2
    (fetched,) = await fetcher.fetch({P0: 4})
    assert (fetched.tp, fetched.position, fetched.next_offset) == (P0, 4, 7)

    target = Partition(tmp_path / "p0", records)
    count, last = write_fetched(target, fetched)
    assert (count, last) == (3, 6)  # offsets 4 to 6: not offset 3, which the batch began with
    assert target.state()[0] == {b"k4": b"v4", b"k5": b"v5", b"k6": b"v6"}
