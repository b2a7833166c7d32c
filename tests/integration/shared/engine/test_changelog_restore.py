"""Bulk restore of changelog partitions into RocksDB, on the real broker: the rows are the
changelog's last values (deletes applied), only the tail past the persisted offset is read,
and partitions lagging less than the threshold are left to Faust's own reader."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from faust.types import TP
from rocksdict import Rdict

from shared.engine._faust import FAUST_OFFSET_KEY
from shared.engine._partitioning import partition_for
from shared.engine._restore import ChangelogReader, restore_changelog
from shared.engine._rocksdb import engine_family, open_partition_db
from shared.settings import Settings
from tests.support.kafka import create_topics, produce

pytestmark = pytest.mark.integration

PARTITIONS = 2


class RdictPartition:
    """A partition's RocksDB as the engine's store keeps it: rows in the default family, the
    persisted offset row in the engine family."""

    def __init__(self, path: Path) -> None:
        self._db = open_partition_db(path)

    def db(self) -> Rdict:
        return self._db

    def persisted_offset(self) -> int | None:
        raw = engine_family(self._db).get(FAUST_OFFSET_KEY)
        return int(raw) if raw is not None else None

    def set_persisted_offset(self, offset: int) -> None:
        engine_family(self._db).put(FAUST_OFFSET_KEY, str(offset).encode())

    def rows(self) -> dict[bytes, bytes]:
        return {cast(bytes, k): cast(bytes, v) for k, v in self._db.items()}


def history(n_keys: int, rounds: int) -> tuple[list[tuple[bytes, bytes | None]], dict[bytes, bytes]]:
    """Writes in rounds (each key overwritten), every fifth key deleted in the last round."""
    records: list[tuple[bytes, bytes | None]] = []
    latest: dict[bytes, bytes] = {}
    for r in range(rounds):
        for i in range(n_keys):
            key = f"key-{i:05d}".encode()
            if r == rounds - 1 and i % 5 == 0:
                records.append((key, None))
                latest.pop(key, None)
            else:
                value = f"v{r}-{i}".encode()
                records.append((key, value))
                latest[key] = value
    return records, latest


@pytest.fixture
def changelog(prefix: str) -> str:
    topic = f"{prefix}table-changelog"
    create_topics([topic], partitions=PARTITIONS, compacted=[topic])
    return topic


@pytest.fixture
def targets(tmp_path: Path) -> dict[int, RdictPartition]:
    return {p: RdictPartition(tmp_path / f"p{p}") for p in range(PARTITIONS)}


def restore(kafka_bootstrap: str, topic: str, targets: dict[int, RdictPartition], min_lag: int) -> int:
    settings = Settings(kafka_bootstrap_servers=kafka_bootstrap)
    by_tp = {TopicPartition(topic, p): t for p, t in targets.items()}
    return asyncio.run(restore_changelog(settings, by_tp, min_lag)).records


def test_restore_brings_every_partition_to_the_changelogs_last_values(
    kafka_bootstrap: str, changelog: str, targets: dict[int, RdictPartition]
) -> None:
    records, latest = history(n_keys=3000, rounds=3)
    produce(changelog, records)
    assert restore(kafka_bootstrap, changelog, targets, min_lag=1) == len(records)

    restored: dict[bytes, bytes] = {}
    for p, target in targets.items():
        rows = target.rows()
        assert all(partition_for(k, PARTITIONS) == p for k in rows)
        restored.update(rows)
    assert restored == latest
    assert sum((t.persisted_offset() or 0) + 1 for t in targets.values()) == len(records)
    # Caught up: a second restore reads nothing.
    assert restore(kafka_bootstrap, changelog, targets, min_lag=1) == 0


def test_restore_reads_only_past_the_persisted_offset_and_respects_the_threshold(
    kafka_bootstrap: str, changelog: str, targets: dict[int, RdictPartition]
) -> None:
    first, _ = history(n_keys=500, rounds=1)
    produce(changelog, first)
    assert restore(kafka_bootstrap, changelog, targets, min_lag=1) == len(first)
    # Changed locally after the restore: a restore that re-read the log from its start,
    # not from the persisted offset, would put the changelog's value back.
    targets[partition_for(b"key-00001", PARTITIONS)].db().put(b"key-00001", b"local")

    tail = [(f"key-{i:05d}".encode(), b"tail") for i in range(100, 140)]
    produce(changelog, tail)
    lag = len(tail)
    assert restore(kafka_bootstrap, changelog, targets, min_lag=lag + 1) == 0  # below the threshold: untouched
    assert all(targets[partition_for(k, PARTITIONS)].db().get(k) != b"tail" for k, _ in tail)

    assert restore(kafka_bootstrap, changelog, targets, min_lag=1) == lag
    assert all(targets[partition_for(k, PARTITIONS)].db().get(k) == b"tail" for k, _ in tail)
    assert targets[partition_for(b"key-00001", PARTITIONS)].db().get(b"key-00001") == b"local"


def test_the_reader_answers_highwaters_and_earliest_offsets_as_faust_asks_them(kafka_bootstrap: str, changelog: str) -> None:
    records, _ = history(n_keys=200, rounds=1)
    produce(changelog, records)
    per_partition = {p: sum(1 for k, _ in records if partition_for(k, PARTITIONS) == p) for p in range(PARTITIONS)}

    async def lookups() -> tuple[dict[TP, int], dict[TP, int], dict[TP, int]]:
        reader = ChangelogReader(Settings(kafka_bootstrap_servers=kafka_bootstrap))
        try:
            tps = [TP(changelog, p) for p in range(PARTITIONS)]
            return await reader.highwaters(*tps), await reader.earliest_offsets(*tps), await reader.highwaters()
        finally:
            await reader.stop()

    highwaters, earliest, none = asyncio.run(lookups())
    assert highwaters == {TP(changelog, p): n for p, n in per_partition.items()}
    assert earliest == {TP(changelog, p): 0 for p in range(PARTITIONS)}
    assert none == {}


def test_restore_under_read_committed_leaves_out_aborted_transactions_and_markers(
    kafka_bootstrap: str, changelog: str, targets: dict[int, RdictPartition]
) -> None:
    """Committed transactions, aborted ones (one of them interleaved with a committed one of
    another producer), and records written outside transactions, in one partition: the restore
    applies the committed and the plain records only, and goes past every marker."""

    async def write() -> None:
        first = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"{changelog}-1")
        second = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"{changelog}-2")
        plain = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        for producer in (first, second, plain):
            await producer.start()
        try:
            async with first.transaction():
                for key in (b"a", b"b"):
                    await first.send_and_wait(changelog, b"1", key=key, partition=0)
            await first.begin_transaction()
            await first.send_and_wait(changelog, b"aborted", key=b"a", partition=0)
            await first.send_and_wait(changelog, b"aborted", key=b"c", partition=0)
            await second.begin_transaction()
            await second.send_and_wait(changelog, b"1", key=b"e", partition=0)
            await first.send_and_wait(changelog, b"aborted", key=b"e", partition=0)
            await second.commit_transaction()
            await first.abort_transaction()
            await plain.send_and_wait(changelog, b"1", key=b"d", partition=0)
            async with second.transaction():
                await second.send_and_wait(changelog, b"2", key=b"b", partition=0)
                await second.send_and_wait(changelog, None, key=b"d", partition=0)
            await first.begin_transaction()
            await first.send_and_wait(changelog, b"aborted", key=b"f", partition=0)
            await first.abort_transaction()
        finally:
            for producer in (first, second, plain):
                await producer.stop()

    asyncio.run(write())
    assert restore(kafka_bootstrap, changelog, {0: targets[0]}, min_lag=1) == 6
    assert targets[0].rows() == {b"a": b"1", b"b": b"2", b"e": b"1"}
    # Past the last data record (the abort marker after it is not applied, and not read again).
    assert targets[0].persisted_offset() is not None
    assert restore(kafka_bootstrap, changelog, {0: targets[0]}, min_lag=1) == 0


#: A restore in a process of its own, killed (SIGKILL) in its third checkpoint: rows of two
#: fetches written since the last checkpoint, without the WAL, and not covered by an offset yet.
KILLED_RESTORE = """
import asyncio, os, sys
from pathlib import Path
from aiokafka import TopicPartition
from shared.engine import _restore
from shared.engine._rocksdb import open_partition_db, persisted_offset, set_persisted_offset
from shared.settings import Settings

bootstrap, topic, path = sys.argv[1:]
_restore.RESTORE_CHECKPOINT_S = 0.0  # a checkpoint after every fetch
_restore.RESTORE_PARTITION_FETCH_BYTES = 64 * 1024  # many fetches
checkpoint, calls = _restore.checkpoint, []

def killed_in_the_third(targets, applied):
    calls.append(1)
    if len(calls) == 3:
        print("killed here", flush=True)
        sys.stdin.read()  # until the SIGKILL
    checkpoint(targets, applied)

_restore.checkpoint = killed_in_the_third

class Target:
    def __init__(self):
        self._db = open_partition_db(path)
    def db(self):
        return self._db
    def persisted_offset(self):
        return persisted_offset(self._db)
    def set_persisted_offset(self, offset):
        set_persisted_offset(self._db, offset)

asyncio.run(_restore.restore_changelog(Settings(kafka_bootstrap_servers=bootstrap), {TopicPartition(topic, 0): Target()}, 1))
"""


def test_a_restore_killed_between_checkpoints_keeps_every_row_its_offset_covers_and_goes_on(
    kafka_bootstrap: str, changelog: str, tmp_path: Path
) -> None:
    values = {f"key-{i:06d}".encode(): f"value-{i}-".encode() * 8 for i in range(20_000)}  # each key once

    async def write() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=5)
        await producer.start()
        try:
            for key, value in values.items():
                await producer.send(changelog, value, key=key, partition=0)
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(write())
    path = tmp_path / "p0"
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_RESTORE, kafka_bootstrap, changelog, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[4],
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"killed here\n"
    finally:
        child.kill()
        child.wait()

    target = RdictPartition(path)
    offset = target.persisted_offset()
    assert offset is not None and 0 < offset < len(values) - 1  # two checkpoints done, of part of the log
    rows = target.rows()
    keys = list(values)
    assert all(rows.get(key) == values[key] for key in keys[: offset + 1])  # nothing an offset covers was lost

    assert restore(kafka_bootstrap, changelog, {0: target}, min_lag=1) == len(values) - offset - 1
    assert target.rows() == values
