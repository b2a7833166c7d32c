"""Restore table partitions from their changelogs in bulk, before Faust's recovery reads them.

Faust's recovery hands each changelog record through an asyncio queue and a per-record
bookkeeping loop: about 10,000 records/s on two cores, so a million-row partition set
that an instance takes over without a caught-up local copy (a cold start, a lost data
dir, a new instance, a failover without a standby) keeps its keys unanswerable for
minutes. Reading the same records with fetch requests of its own and writing them to RocksDB
in write batches is more than an order of magnitude faster: the records go from the broker's
record batches (aiokafka's Cython reader) into RocksDB write batches, with no Python object
per record but the reader's (:class:`ChangelogFetcher`), and the next fetch is on its way
while one is written.

So with ``bulk_restore`` on (the default; ``STATEFLEET_BULK_RESTORE``), the fleet's table
manager (:class:`BulkRestoringTableManager`) gives Faust a recovery
service (:class:`BulkRestoringRecovery`) that, after every rebalance, first reads each
assigned partition (active or standby) whose local copy lags its changelog by at least
``bulk_restore_min_lag`` records: from the partition's persisted offset to the
changelog's end offset (Faust reads the highwaters it checks offsets against only
afterwards), writing the rows (a record with no value deletes its key; next-offset rows go
to the partition's engine column family, see :mod:`shared.engine._rocksdb`) and advancing
the persisted offset, and Faust's own offset for the partition, after each write batch.
Faust's reader then starts from there, reads whatever arrived since, and runs the
tables' ``on_recover`` callbacks as before.

The rows are written without RocksDB's write-ahead log (with it, its writing was about a
third of the restore's own CPU). Every :data:`RESTORE_CHECKPOINT_S` and whenever a restore
ends (caught up, out of budget, cancelled by a rebalance, failed), :func:`checkpoint` flushes
the databases' memtables to files and only then moves the persisted offsets, with the log. So
a crash mid-restore leaves rows and offset consistent: the rows an offset covers are in files
before it is written, a crash loses at most the rows of the last few seconds, past the offset,
and the next restore reads them again (re-applying a changelog record is harmless: last write
wins, in log order). Nothing else writes to a database while its restore runs, and after it
every write goes through the log again.

The restore runs in Faust's highwater step, which Faust bounds by ``broker_request_timeout``
(90 s; it stops recovering for good when a step runs out of it). So it goes in rounds: when a
round's budget (:meth:`BulkRestoringRecovery.round_budget_s`) is over with partitions left,
the step ends by restarting Faust's recovery steps, as a new rebalance would, and the next
round's highwater step goes on from the persisted offsets. Every assigned partition is thus
carried to its changelog's end in bulk, whatever its size, before Faust's reader starts
(10,000,000 stored entries left about 13 of 20 million records to Faust's reader before: 24.8
minutes to ready). The setting itself is also the clients' request timeout, so it
is left as it is.

It runs in Faust's recovery service, after the rebalance has completed: the consumer
heartbeats meanwhile, and a new rebalance cancels it as it cancels Faust's own steps.
Restoring standbys too means a standby is caught up right after the rebalance that gave
it to this instance, so a failover soon after a scale-out finds a complete local copy.

The same plain consumer (:class:`ChangelogReader`) answers the recovery's lookups of
changelog highwaters and earliest offsets, which Faust would send through its own
consumer's connection, behind a fetch that may wait 1.5 s for records.

Each restore is measured (:class:`RestoreTally`): from the assignment to the actives'
recovery done (``statefleet_restore_seconds``), the changelog records read meanwhile, by
the bulk restore and by Faust's reader (``statefleet_restored_records_total``,
``source="changelog"``), and one INFO line saying how many partitions had a local copy. A
restart that kept its RocksDB volume reads few records; one without reads the changelogs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol, cast

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka import errors as kafka_errors
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.record.control_record import ABORT_MARKER, ControlRecord
from aiokafka.record.memory_records import MemoryRecords
from faust.stores.rocksdb import Store as RocksDBStore
from faust.types import TP, ConsumerT
from mode import Service
from rocksdict import Rdict

from shared.engine._clients import ISOLATION_LEVEL, client_kwargs
from shared.engine._context import context_of
from shared.engine._copies import note_incarnations
from shared.engine._faust import RecoveryHooks, TableManagerHooks, consumer_partition_state, kafka_client, store_partition_db
from shared.engine._identity import ChangelogNow, Incarnation, check_partition, current_incarnations, discard, record
from shared.engine._retry import broker_failure, retry_delay_s, retry_reason
from shared.engine._rocksdb import PartitionWrite, flush_partition, persisted_offset, set_persisted_offset
from shared.metrics import LOCAL_STATE_DISCARDED, RESTORE_RETRIES, RESTORE_SECONDS, RESTORED_RECORDS
from shared.settings import Settings

log = logging.getLogger(__name__)


PROGRESS_EVERY_S = 5.0

#: How often standby copies apply the changelog records Faust buffered for them.
STANDBY_FLUSH_INTERVAL_S = 0.2

#: How long table recovery may apply nothing, with records left, before the consumer's state is logged.
RECOVERY_STALL_CHECK_S = 10.0


class PartitionTarget(Protocol):
    """Where one changelog partition is restored to."""

    def db(self) -> Rdict:
        """The partition's database, opened with its engine family (as the engine's store opens it)."""
        ...

    def persisted_offset(self) -> int | None: ...

    def set_persisted_offset(self, offset: int) -> None: ...


@dataclass
class RestoreResult:
    records: int
    seconds: float
    partitions: int
    #: Partitions not brought to their end offsets (the budget ran out first).
    left: int = 0

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


#: Most bytes one fetch of a bulk restore brings, per partition and in all.
RESTORE_PARTITION_FETCH_BYTES = 4 * 1024 * 1024
RESTORE_FETCH_BYTES = 16 * 1024 * 1024
#: Longest a bulk restore's fetch waits for records when there are none yet.
RESTORE_FETCH_WAIT_MS = 500
#: How often a bulk restore flushes what it wrote and moves the persisted offsets (:func:`checkpoint`):
#: what a crash makes it read again.
RESTORE_CHECKPOINT_S = 5.0
#: The pause before a fetch that failed everywhere (no broker answered) is sent again.
RESTORE_RETRY_BACKOFF_S = 0.1
#: Most records decoded and written at a time.
RESTORE_BATCH_RECORDS = 10_000


class Fetcher(Protocol):
    """Where a bulk restore's records come from (:class:`ChangelogFetcher`)."""

    async def fetch(self, positions: Mapping[TopicPartition, int]) -> list[FetchedPartition]:
        """One fetch of the partitions at ``positions``; a partition may be absent from the
        answer (fetched again next time)."""
        ...


def _next_offset(persisted: int | None) -> int:
    return 0 if persisted is None else persisted + 1


class ChangelogReader:
    """A plain consumer (no group) for changelog offsets and bulk restores.

    It also answers Faust's recovery when it reads highwaters and earliest offsets: Faust
    asks through its own consumer, whose connection to the broker is then often busy
    with a fetch that waits up to 1.5 s (Faust's ``fetch_max_wait_ms``) for records, so
    each lookup of a rebalance took about 1.5 s instead of milliseconds.
    """

    #: Where bulk restores fetch from: by default a :class:`ChangelogFetcher` over the reader's consumer.
    fetcher: Fetcher | None = None

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._consumer: AIOKafkaConsumer | None = None

    async def _client(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(
                **client_kwargs(self.settings),
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                # What one fetch brings is held in memory until it is written: bounded well below
                # the RocksDB budget (STATEFLEET_ROCKSDB_*), so a restore does not set the peak.
                max_partition_fetch_bytes=RESTORE_PARTITION_FETCH_BYTES,
                fetch_max_bytes=RESTORE_FETCH_BYTES,
                isolation_level=ISOLATION_LEVEL,
            )
            await consumer.start()
            self._consumer = consumer
        return self._consumer

    async def stop(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.stop()

    async def highwaters(self, *tps: TP) -> dict[TP, int]:
        """End offsets, as Faust's ``ConsumerT.highwaters`` gives them: one past the last
        committed record (see :meth:`_past_last_committed`; in either guarantee, since a
        changelog written under exactly_once keeps its markers after a switch back)."""
        if not tps:
            return {}
        consumer = await self._client()
        ends = {
            tp: int(end)
            for tp, end in (await consumer.end_offsets([TopicPartition(tp.topic, tp.partition) for tp in tps])).items()
        }
        ends = await self._past_last_committed(consumer, ends)
        return {TP(tp.topic, tp.partition): end for tp, end in ends.items()}

    @staticmethod
    async def _past_last_committed(consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Per partition, one past its last committed record below ``ends`` (the last stable
        offsets), or its log start when it holds none.

        Faust's recovery is done with a partition once it has applied the record at its
        highwater (end - 1). Read committed, the end is one past the last transaction's marker,
        an offset no record is ever read at, so Faust would wait for good (its check for
        aborted transactions at the end runs only after 5 s without records, and fails when the
        position is not known yet). So the end is moved back to the last committed record:
        the partition's tail is read, in a window that widens while it finds none (a tail of
        aborted records), once per rebalance."""
        starts = {tp: int(start) for tp, start in (await consumer.beginning_offsets(list(ends))).items()}
        out = {tp: end for tp, end in ends.items() if end <= starts[tp]}
        todo = {tp: end for tp, end in ends.items() if end > starts[tp]}
        window = 64
        try:
            while todo:
                lows = {tp: max(starts[tp], end - window) for tp, end in todo.items()}
                consumer.assign(list(todo))
                for tp, low in lows.items():
                    consumer.seek(tp, low)
                last: dict[TopicPartition, int] = {}
                reading = set(todo)
                while reading:
                    batches = await consumer.getmany(*reading, timeout_ms=100)
                    for tp, messages in batches.items():
                        for message in messages:
                            if message.offset < todo[tp]:
                                last[tp] = max(last.get(tp, -1), message.offset)
                    for tp in list(reading):
                        if await consumer.position(tp) >= todo[tp]:
                            reading.discard(tp)
                for tp in list(todo):
                    if tp in last:
                        out[tp] = last[tp] + 1
                    elif lows[tp] == starts[tp]:
                        out[tp] = starts[tp]  # nothing committed at all
                    else:
                        continue
                    del todo[tp]
                window *= 16
        finally:
            consumer.unsubscribe()
        return out

    async def earliest_offsets(self, *tps: TP) -> dict[TP, int]:
        """Log start offsets, as Faust's ``ConsumerT.earliest_offsets`` gives them."""
        if not tps:
            return {}
        starts = await (await self._client()).beginning_offsets([TopicPartition(tp.topic, tp.partition) for tp in tps])
        return {TP(tp.topic, tp.partition): int(start) for tp, start in starts.items()}

    async def incarnations(self, topics: set[str]) -> dict[str, Incarnation]:
        """The cluster id and topic id of each of ``topics`` (see :mod:`shared.engine._identity`)."""
        return await current_incarnations(client_kwargs(self.settings), topics)

    async def bounds(self, tps: list[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
        """Each partition's log start and end offsets (committed records only)."""
        consumer = await self._client()
        starts = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        return {tp: (int(starts[tp]), int(ends[tp])) for tp in tps}

    async def high_watermarks(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Each partition's end offset counting every record written (read_uncommitted): a
        transaction's records are behind the end a committed reader gets (the last stable offset)
        until the broker has written its commit marker, which it does after the commit has
        returned to the producer, so a worker that just committed is ahead of that end."""
        consumer = AIOKafkaConsumer(**client_kwargs(self.settings), enable_auto_commit=False, isolation_level="read_uncommitted")
        await consumer.start()
        try:
            return {tp: int(end) for tp, end in (await consumer.end_offsets(tps)).items()}
        finally:
            await consumer.stop()

    async def read_range(self, tp: TopicPartition, low: int, high: int) -> list[tuple[int, bytes, bytes | None]]:
        """The committed records of ``tp`` from offset ``low`` to ``high`` inclusive: (offset, key, value)."""
        consumer = await self._client()
        consumer.assign([tp])
        out: list[tuple[int, bytes, bytes | None]] = []
        try:
            consumer.seek(tp, low)
            while await consumer.position(tp) <= high:
                # Short waits: a range of markers or aborted records returns nothing, but the
                # position moves past it.
                fetched = await consumer.getmany(tp, timeout_ms=100)
                out.extend((m.offset, m.key, m.value) for m in fetched.get(tp, []) if low <= m.offset <= high)
        finally:
            consumer.unsubscribe()
        return out

    async def restore(
        self, targets: Mapping[TopicPartition, PartitionTarget], min_lag: int, *, budget_s: float | None = None
    ) -> RestoreResult:
        """Bring each target up to its changelog partition's current end offset, if it
        lags by ``min_lag`` or more; stop after ``budget_s``."""
        started = time.perf_counter()
        consumer = await self._client()
        ends = {tp: int(end) for tp, end in (await consumer.end_offsets(list(targets))).items()}
        starts = {tp: _next_offset(targets[tp].persisted_offset()) for tp in targets}
        todo = {tp: ends[tp] for tp in targets if ends[tp] - starts[tp] >= max(min_lag, 1)}
        if not todo:
            return RestoreResult(0, time.perf_counter() - started, 0)
        total = sum(ends[tp] - starts[tp] for tp in todo)
        log.info("bulk restore: %d partitions lag their changelogs by %d records; reading them directly", len(todo), total)
        fetcher = self.fetcher or ChangelogFetcher(consumer, read_committed=ISOLATION_LEVEL == "read_committed")
        records, left = await self._read_to_ends(
            fetcher, targets, {tp: starts[tp] for tp in todo}, todo, total, started, budget_s
        )
        result = RestoreResult(records, time.perf_counter() - started, len(todo), left)
        log.info(
            "bulk restore: %d records into %d partitions in %.1fs (%.0f records/s)%s",
            result.records,
            result.partitions,
            result.seconds,
            result.rate,
            f", {left} partitions not caught up yet" if left else "",
        )
        return result

    @staticmethod
    async def _read_to_ends(
        fetcher: Fetcher,
        targets: Mapping[TopicPartition, PartitionTarget],
        starts: Mapping[TopicPartition, int],
        ends: Mapping[TopicPartition, int],
        total: int,
        started: float,
        budget_s: float | None,
    ) -> tuple[int, int]:
        """Read from ``starts`` and write until every partition's position reaches its end in
        ``ends``, or ``budget_s`` passes: (records written, partitions not caught up).

        The next fetch is on its way while one is written; the records are written batch by
        batch as the broker sent them, one RocksDB write batch per partition and fetch."""
        positions = dict(starts)
        records = 0
        last_report = last_checkpoint = time.perf_counter()
        applied: dict[TopicPartition, int] = {}  # written without the WAL, persisted offset not moved yet
        remaining = {tp: end for tp, end in ends.items() if positions[tp] < end}
        pending: asyncio.Task[list[FetchedPartition]] | None = None
        try:
            while remaining:
                if budget_s is not None and time.perf_counter() - started > budget_s:
                    break
                if pending is None:
                    pending = asyncio.ensure_future(fetcher.fetch({tp: positions[tp] for tp in remaining}))
                fetched = await pending
                pending = None
                for part in fetched:
                    positions[part.tp] = part.next_offset
                    if part.next_offset >= remaining.get(part.tp, part.next_offset + 1):
                        del remaining[part.tp]
                # The next fetch goes out before this one is written (fetch positions are known
                # from the batches' headers already).
                if remaining and (budget_s is None or time.perf_counter() - started <= budget_s):
                    pending = asyncio.ensure_future(fetcher.fetch({tp: positions[tp] for tp in remaining}))
                for part in fetched:
                    count, last = write_fetched(targets[part.tp], part)
                    if count:
                        records += count
                        applied[part.tp] = last
                now = time.perf_counter()
                if now - last_checkpoint >= RESTORE_CHECKPOINT_S:
                    last_checkpoint = now
                    checkpoint(targets, applied)
                if now - last_report >= PROGRESS_EVERY_S:
                    last_report = now
                    rate = records / (now - started)
                    log.info(
                        "bulk restore: %d of about %d records (%.0f/s), %d partitions to go, about %.0fs left",
                        records,
                        total,
                        rate,
                        len(remaining),
                        max(0, total - records) / rate if rate > 0 else float("nan"),
                    )
        finally:
            # Whatever ends the restore (done, the budget, a cancellation by a new rebalance, an
            # error), what it wrote is flushed and covered by the persisted offsets before anything
            # else writes to these databases (with the WAL) or reads their offsets.
            checkpoint(targets, applied)
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending
        return records, len(remaining)


@dataclass
class FetchedPartition:
    """What one fetch brought of a partition: the record batches to apply (aborted
    transactions' batches and control batches left out), the first offset to apply, and the
    offset the next fetch starts at."""

    tp: TopicPartition
    batches: list[Any]
    position: int
    next_offset: int


#: Partition errors of a fetch that a metadata refresh and another fetch get past (the leader
#: moved, or is being elected).
RETRY_AFTER_METADATA = (
    kafka_errors.NotLeaderForPartitionError,
    kafka_errors.LeaderNotAvailableError,
    kafka_errors.UnknownTopicOrPartitionError,
    kafka_errors.KafkaStorageError,
)


class ChangelogFetcher:
    """Fetch requests for changelog partitions, sent to their leaders through the consumer's
    client, and the record batches they bring, undecoded.

    :meth:`AIOKafkaConsumer.getmany` builds a ``ConsumerRecord`` for each record (about 1.5 µs
    of Python each, with the iteration around it: 60% of a bulk restore's time under the
    profiler, and the part of the bare consumer's rate a restore cannot beat); the bulk restore
    needs only each record's key, value and offset, which aiokafka's record batches (its
    Cython reader) give. What getmany's fetcher does besides is done here too: a
    read_committed fetch leaves out the batches of aborted transactions (the fetch response's
    list of them) and every control batch, and a partition whose leader moved is fetched again
    after a metadata refresh."""

    def __init__(self, consumer: AIOKafkaConsumer, *, read_committed: bool) -> None:
        self.consumer = consumer
        self.client = kafka_client(consumer)
        self.read_committed = read_committed

    async def fetch(self, positions: Mapping[TopicPartition, int]) -> list[FetchedPartition]:
        """One fetch from each leader of ``positions``' partitions (waiting at most
        :data:`RESTORE_FETCH_WAIT_MS` for records); partitions whose fetch failed retriably
        are absent from the answer."""
        cluster = self.client.cluster
        by_node: dict[int, dict[str, list[tuple[int, int, int]]]] = {}
        leaderless = False
        order = list(positions.items())
        random.shuffle(order)  # which partitions come first, within the fetch's byte limit
        for tp, offset in order:
            node = cluster.leader_for_partition(tp)
            if node is None or node < 0:
                leaderless = True
                continue
            by_node.setdefault(node, {}).setdefault(tp.topic, []).append((tp.partition, offset, RESTORE_PARTITION_FETCH_BYTES))
        isolation = 1 if self.read_committed else 0
        requests = [
            self.client.send(node, FetchRequest(RESTORE_FETCH_WAIT_MS, 1, RESTORE_FETCH_BYTES, isolation, list(topics.items())))
            for node, topics in by_node.items()
        ]
        out: list[FetchedPartition] = []
        refresh = leaderless
        out_of_range: list[TopicPartition] = []
        responses = await asyncio.gather(*requests, return_exceptions=True)
        for node, response in zip(by_node, responses, strict=True):
            if isinstance(response, BaseException):
                if isinstance(response, kafka_errors.KafkaError) and response.retriable:
                    # A broker that died or restarted, a leader that moved: its partitions are
                    # fetched again once the metadata has been read again.
                    log.info("bulk restore: fetching from broker %d again (%s: %s)", node, type(response).__name__, response)
                    refresh = True
                    continue
                raise response
            for topic, partitions in response.topics:
                for partition, error_code, _highwater, *rest in partitions:
                    tp = TopicPartition(topic, partition)
                    error = kafka_errors.for_code(error_code)
                    if error is kafka_errors.NoError:
                        aborted = rest[1] if response.API_VERSION == 4 else rest[2]
                        out.append(self._batches(tp, positions[tp], MemoryRecords(rest[-1]), aborted))
                    elif error is kafka_errors.OffsetOutOfRangeError:
                        out_of_range.append(tp)
                    elif error in RETRY_AFTER_METADATA:
                        log.info("bulk restore: fetching %s again after a metadata refresh (%s)", tp, error.__name__)
                        refresh = True
                    else:
                        raise error(f"bulk restore: fetching {tp} at offset {positions[tp]}")
        if refresh:
            await self.client.force_metadata_update()
            if not out:  # nothing fetched at all: not again at once
                await asyncio.sleep(RESTORE_RETRY_BACKOFF_S)
        if out_of_range:
            # Below the log start (retention or compaction removed the records since the
            # persisted offset): on from the log start, as the consumer's "earliest" reset does.
            starts = await self.consumer.beginning_offsets(out_of_range)
            for tp in out_of_range:
                start = int(starts[tp])
                if start <= positions[tp]:
                    raise kafka_errors.OffsetOutOfRangeError(f"bulk restore: {tp} at offset {positions[tp]} (log start {start})")
                log.info("bulk restore: %s starts at %d, past offset %d: reading on from there", tp, start, positions[tp])
                out.append(FetchedPartition(tp, [], start, start))
        return out

    def _batches(
        self, tp: TopicPartition, position: int, records: Any, aborted_transactions: list[tuple[int, int]] | None
    ) -> FetchedPartition:
        """The batches of one partition's answer to apply, as aiokafka's fetcher selects them."""
        aborted = sorted(aborted_transactions or (), key=lambda t: t[1])
        aborted_producers: set[int] = set()
        batches: list[Any] = []
        next_offset = position
        while records.has_next():
            batch = records.next_batch()
            if batch is None:
                break
            if not batch.validate_crc():
                raise kafka_errors.CorruptRecordException(f"bulk restore: invalid CRC in {tp} at {batch.base_offset}")
            if self.read_committed and batch.producer_id is not None:
                while aborted and aborted[0][1] <= batch.base_offset:
                    aborted_producers.add(aborted.pop(0)[0])
                if batch.is_control_batch and _is_abort_marker(batch):
                    aborted_producers.discard(batch.producer_id)
                if batch.is_transactional and batch.producer_id in aborted_producers:
                    next_offset = batch.next_offset
                    continue
            next_offset = batch.next_offset
            if not batch.is_control_batch:
                batches.append(batch)
        # Only a part of a batch (the fetch's byte limit was reached in it): the partitions are in
        # another order next time, and the broker sends the first partition's first batch whole.
        return FetchedPartition(tp, batches, position, next_offset)


def _is_abort_marker(batch: Any) -> bool:
    for control in batch:
        return bool(control.key is not None and ControlRecord.parse(control.key) == ABORT_MARKER)
    return False


async def restore_changelog(settings: Settings, targets: Mapping[TopicPartition, PartitionTarget], min_lag: int) -> RestoreResult:
    """:meth:`ChangelogReader.restore` with a reader of its own."""
    reader = ChangelogReader(settings)
    try:
        return await reader.restore(targets, min_lag)
    finally:
        await reader.stop()


def write_fetched(target: PartitionTarget, fetched: FetchedPartition) -> tuple[int, int]:
    """Apply the records of one fetch of a partition (from its fetch position on) in one write
    batch, without the WAL: (records applied, offset of the last of them). The persisted offset
    is moved by :func:`checkpoint`."""
    write = PartitionWrite(target.db())
    count, last = write.apply_batches(fetched.batches, fetched.position)
    if count:
        write.write(wal=False)
    return count, last


def checkpoint(targets: Mapping[TopicPartition, PartitionTarget], applied: dict[TopicPartition, int]) -> None:
    """Flush what a bulk restore wrote without the WAL to SST files (both families of each
    database), then move each partition's persisted offset (with the WAL) to the last record
    written; ``applied`` is emptied.

    A crash loses the rows written since the last checkpoint, never rows an offset covers:
    the offset is written only once the rows are in files, and the next restore reads again
    from it (re-applying records is harmless: last write wins, in log order)."""
    for tp, last in applied.items():
        target = targets[tp]
        flush_partition(target.db())
        target.set_persisted_offset(last)
    applied.clear()


def write_batch(target: PartitionTarget, messages: list[Any]) -> int:
    """Apply changelog records to a partition's RocksDB (each row into its column family) in one
    write batch, then advance its persisted offset: a crash between the two re-reads the
    records, and re-applying them is harmless (last write wins, in log order)."""
    if not messages:
        return 0
    write = PartitionWrite(target.db())
    write.apply_records(messages)
    write.write()
    target.set_persisted_offset(messages[-1].offset)
    return len(messages)


@dataclass
class RestoreTally:
    """One restore: from an assignment to its active partitions recovered (a rebalance that
    comes meanwhile restarts the recovery, not the tally)."""

    started: float
    #: Changelog partitions (active and standby) being restored, and those of them that had a
    #: local copy (a persisted offset) when the restore began.
    partitions: set[TP] = field(default_factory=set)
    with_local_state: set[TP] = field(default_factory=set)
    #: Records the bulk restore wrote.
    bulk_records: int = 0
    #: Per active partition, the offset Faust's reader started from (after the bulk restore).
    faust_from: dict[TP, int] = field(default_factory=dict)

    def note_partitions(self, persisted: Mapping[TP, int | None]) -> None:
        """Count partitions not seen yet in this restore, with their persisted offsets (None: no local copy)."""
        for tp, offset in persisted.items():
            if tp not in self.partitions:
                self.partitions.add(tp)
                if offset is not None:
                    self.with_local_state.add(tp)

    def faust_records(self, active_offsets: Mapping[TP, int | None]) -> int:
        """Offsets Faust's reader moved the actives past since it started (compacted changelogs
        can make that a little more than the records it read)."""
        read = 0
        for tp, start in self.faust_from.items():
            offset = active_offsets.get(tp)
            if offset is not None:
                read += max(0, int(offset) - start)
        return read

    def finish(self, service: str, active_offsets: Mapping[TP, int | None], now: float) -> tuple[int, float]:
        """Record the restore's metrics and log it; (records, seconds)."""
        records = self.bulk_records + self.faust_records(active_offsets)
        seconds = max(0.0, now - self.started)
        RESTORE_SECONDS.labels(service).observe(seconds)
        RESTORED_RECORDS.labels(service, "changelog").inc(records)
        log.info(
            "restored %d records from the changelog in %.1f s (%d of %d partitions had local state)",
            records,
            seconds,
            len(self.with_local_state),
            len(self.partitions),
        )
        return records, seconds


class BulkRestoringRecovery(RecoveryHooks):
    """Faust's recovery service, bringing lagging partitions up to date in bulk first,
    and reading changelog offsets with a :class:`ChangelogReader`."""

    _reader: ChangelogReader | None = None

    def _changelog_reader(self) -> ChangelogReader | None:
        context = context_of(self.app)
        if context is None:
            return None
        settings = context.settings
        if self._reader is None:
            self._reader = ChangelogReader(settings)
        return self._reader

    async def on_stop(self) -> None:
        await super().on_stop()
        if self._reader is not None:
            await self._reader.stop()

    # -- measuring each restore (see RestoreTally) --------------------------------------

    _tally: RestoreTally | None = None

    async def on_rebalance(self, assigned: set[TP], revoked: set[TP], newly_assigned: set[TP], generation_id: int = 0) -> None:
        if self._tally is None:
            self._tally = RestoreTally(started=time.monotonic())
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)

    async def on_recovery_completed(self, generation_id: int = 0) -> None:
        # Faust resumes the standby changelog partitions just before this, and its completion
        # then resumes the app's flow control, which empties the tables' changelog queue: the
        # records fetched for the standbys meanwhile are dropped past the consumer's position,
        # and the standby (later an active, from its persisted offset) never holds them. So
        # the standbys are paused across Faust's completion and then read again from the last
        # record the recovery took in (re-reading that one is harmless: Faust skips offsets it
        # has seen).
        consumer = self.app.consumer
        standbys = set(self.standby_tps)
        if standbys:
            consumer.pause_partitions(standbys)
        await super().on_recovery_completed(generation_id)
        self._failed_steps = 0
        if self.app.consumer_generation_id != generation_id:
            return  # the next rebalance's recovery seeks and resumes the standbys, and completes the restore
        if standbys:
            await consumer.seek_wait({tp: max(int(self.standby_offsets[tp]), 0) for tp in standbys})
            consumer.resume_partitions(standbys)
        context = context_of(self.app)
        tally, service = self._tally, context.service if context is not None else None
        if tally is None:
            return
        self._tally = None
        if service is not None:
            tally.finish(service, self.active_offsets, time.monotonic())

    def _note_partitions(self) -> None:
        """Before anything is read: which of the partitions to restore have a local copy."""
        if self._tally is None:
            return
        persisted: dict[TP, int | None] = {}
        for tp in self.active_tps | self.standby_tps:
            if tp in self._tally.partitions:
                continue
            try:
                persisted[tp] = cast(Any, self.tp_to_table[tp]).data.persisted_offset(tp)
            except Exception:  # a store that keeps no offsets, or a database held elsewhere
                persisted[tp] = None
        self._tally.note_partitions(persisted)

    _stalled_at: tuple[int, ...] | None = None

    @Service.timer(RECOVERY_STALL_CHECK_S)
    async def _report_stalled_recovery(self) -> None:
        """Log what the consumer holds for each active changelog partition when table recovery
        has applied nothing for :data:`RECOVERY_STALL_CHECK_S` with records left to read.

        Faust logs nothing while it waits for changelog records (its own warning comes after
        minutes), and a recovery that stops making progress leaves the worker's partitions
        unprocessed: this says where it stopped (position, pause, Faust's read offset)."""
        if not self.in_recovery or not self.active_remaining_total():
            self._stalled_at = None
            return
        progress = tuple(int(self.active_offsets[tp] or -1) for tp in sorted(self.active_tps))
        if progress != self._stalled_at:
            self._stalled_at = progress
            return
        # Asked side by side: a partition without a position costs its state's wait (1 s) once, not once each.
        states = await asyncio.gather(*(self._changelog_state(tp) for tp in sorted(self.active_remaining())))
        log.warning("table recovery applied nothing in %.0fs: %s", RECOVERY_STALL_CHECK_S, "; ".join(states))

    async def _changelog_state(self, tp: TP) -> str:
        state = f"{tp.topic}[{tp.partition}] at {self.active_offsets[tp]} of {self.active_highwaters[tp]}"
        try:
            return (
                state + f", {await consumer_partition_state(cast(faust.App, self.app), tp)}, "
                f"queued {self.tables.changelog_queue.qsize()}, flow {cast(Any, self.app.consumer).flow_active}"
            )
        except Exception as exc:  # the consumer is restarting: the state is unknown
            return state + f" ({exc!r})"

    @Service.timer(STANDBY_FLUSH_INTERVAL_S)
    async def _flush_standbys(self) -> None:
        """Apply what the standbys have read so far.

        Faust applies a standby's changelog records only once a table's buffer holds
        ``standby_buffer_size`` (1,000) of them: a standby of a table that changes less
        than that stays behind for good, and could not answer reads for a failed owner
        (docs/contract.md, "Availability"). Once recovery is done only standby records are
        buffered, and applying them in order, sooner, is what Faust does anyway.
        """
        if not self.in_recovery and any(self.buffers.values()):
            self.flush_buffers()

    # -- a broker's failure ends a step, not the worker -----------------------------------

    #: Steps a broker's failure ended since the last recovery completed (the wait before the
    #: steps run again doubles with each).
    _failed_steps = 0

    async def _retrying_step(self, step: Awaitable[None], what: str) -> None:
        """Run one of the recovery steps this service adds to Faust's; when a broker's failure
        ends it (a leader that moved while its offsets were read, a broker that died mid-fetch),
        run the steps again from the first after a wait, as a new rebalance would.

        Faust's recovery task ends for good on any exception but its own "rebalance again", and
        takes the worker with it: the worker that restarts then pays a full rejoin and restore
        for what the next metadata refresh mends. What the step did before it failed is done
        again the same way (the identity check, the bulk restore from the persisted offsets)."""
        try:
            await step
        except Exception as exc:
            if not broker_failure(exc, transactional=False):
                raise
            self._failed_steps += 1
            delay = retry_delay_s(self._failed_steps)
            context = context_of(self.app)
            RESTORE_RETRIES.labels(context.service if context is not None else "", retry_reason(exc)).inc()
            log.warning(
                "table recovery: %s failed on the brokers' side (%s: %s); the recovery steps run again in %.1fs",
                what,
                type(exc).__name__,
                exc,
                delay,
            )
            await asyncio.sleep(delay)
            self.run_steps_again()

    async def build_highwaters(self, consumer: ConsumerT, tps: set[TP], destination: Counter[TP], title: str) -> None:
        await self._retrying_step(
            self._build_highwaters_of(consumer, tps, destination, title), f"reading the {title} changelogs' ends"
        )

    async def build_offsets(self, consumer: ConsumerT, tps: set[TP], destination: Counter[TP], title: str) -> None:
        await self._retrying_step(
            self._build_offsets_of(consumer, tps, destination, title), f"reading the {title} changelogs' starts"
        )

    async def _build_highwaters_of(self, consumer: ConsumerT, tps: set[TP], destination: Counter[TP], title: str) -> None:
        reader = self._changelog_reader()
        if reader is None:
            await super().build_highwaters(consumer, tps, destination, title)
            return
        # Faust reads the actives' highwaters first, then their offsets, then the
        # standbys': restoring just before that, both sets are known, nothing reads
        # yet, and the highwaters Faust then reads are at or past what was restored.
        if title == "active":
            await self._check_local_state(reader)
            self._note_partitions()
            if reader.settings.bulk_restore and not await self._bulk_restore(reader):
                self._restore_in_next_round()
        await super().build_highwaters(cast(ConsumerT, reader), tps, destination, title)

    async def _build_offsets_of(self, consumer: ConsumerT, tps: set[TP], destination: Counter[TP], title: str) -> None:
        reader = self._changelog_reader()
        await super().build_offsets(cast(ConsumerT, reader) if reader else consumer, tps, destination, title)
        if title == "active" and self._tally is not None:
            # Where Faust's reader starts (what the bulk restore wrote is counted already).
            self._tally.faust_from = {tp: int(destination[tp] if destination[tp] is not None else -1) for tp in tps}

    async def _check_local_state(self, reader: ChangelogReader) -> None:
        """Discard the local state of every assigned partition (active or standby) that belongs to
        another cluster or another incarnation of its changelog, or is ahead of it, before
        anything restores or reads it (see :mod:`shared.engine._identity`)."""
        stores: dict[TopicPartition, RocksDBStore] = {}
        for tp in sorted(self.active_tps | self.standby_tps):
            store = cast(Any, self.tp_to_table[tp]).data
            if isinstance(store, RocksDBStore) and _can_open(store, tp):
                stores[TopicPartition(tp.topic, tp.partition)] = store
        if not stores:
            return
        try:
            # The inputs' too: their next offsets in the tables name the input they count (OrderedInput).
            incarnations = await reader.incarnations({tp.topic for tp in stores} | set(getattr(self.app, "input_topics", ())))
        except Exception as exc:  # a broker that cannot tell topic ids: offsets and rows are still checked
            log.warning(
                "could not read the changelogs' topic ids (%s: %s); checking local state by offsets only", type(exc).__name__, exc
            )
            incarnations = {}
        note_incarnations(cast(faust.App, self.app), incarnations)
        bounds = await reader.bounds(list(stores))
        dbs = {tp: store_partition_db(store, tp.partition) for tp, store in stores.items()}
        # Ahead of the committed end is not shorter than the changelog when the records are there,
        # their transaction committed and its marker not written yet: measured against every record.
        ahead = [tp for tp, db in dbs.items() if (offset := persisted_offset(db)) is not None and offset + 1 > bounds[tp][1]]
        if ahead:
            written = await reader.high_watermarks(ahead)
            bounds.update({tp: (bounds[tp][0], max(bounds[tp][1], written[tp])) for tp in ahead})
        context = context_of(self.app)
        service = context.service if context is not None else ""
        for tp, db in dbs.items():
            current = incarnations.get(tp.topic)
            start, end = bounds[tp]
            verdict = await check_partition(db, ChangelogNow(current, start, end), functools.partial(reader.read_range, tp))
            if not verdict.keep:
                log.warning(
                    "discarding the local state of %s[%d] and restoring it from the changelog: %s",
                    tp.topic,
                    tp.partition,
                    verdict.reason,
                )
                discard(db)
                table_name = cast(Any, self.tp_to_table[TP(tp.topic, tp.partition)]).name
                LOCAL_STATE_DISCARDED.labels(service, table_name, verdict.cause or "").inc()
                offsets = self.active_offsets if TP(tp.topic, tp.partition) in self.active_tps else self.standby_offsets
                offsets[TP(tp.topic, tp.partition)] = -1
            elif verdict.adopted:
                log.info("keeping the local state of %s[%d] of an earlier version: %s", tp.topic, tp.partition, verdict.adopted)
            if current is not None:
                record(db, current)

    async def _bulk_restore(self, reader: ChangelogReader) -> bool:
        """One round of the bulk restore, within what Faust's step allows: whether every
        partition has caught up."""
        targets: dict[TopicPartition, PartitionTarget] = {}
        for tp in sorted(self.active_tps | self.standby_tps):
            store = cast(Any, self.tp_to_table[tp]).data
            if not isinstance(store, RocksDBStore) or not _can_open(store, tp):
                continue
            offsets = self.active_offsets if tp in self.active_tps else self.standby_offsets
            targets[TopicPartition(tp.topic, tp.partition)] = _RecoveringPartition(store, tp, offsets)
        if not targets:
            return True
        result = await reader.restore(targets, reader.settings.bulk_restore_min_lag, budget_s=self.round_budget_s())
        if self._tally is not None:
            self._tally.bulk_records += result.records
        return not result.left

    def round_budget_s(self) -> float:
        """How long one round of the bulk restore may run: Faust gives the step it runs in
        ``broker_request_timeout`` (which is also the clients' request timeout, so it stays as
        it is) and stops recovering for good when a step runs out of it; the rest of the step
        (Faust's highwater lookup) needs far less than the 40% left over."""
        return 0.6 * float(self.app.conf.broker_request_timeout)

    def _restore_in_next_round(self) -> NoReturn:
        """Restart Faust's recovery steps, as a new rebalance does, so that the next round's
        highwater step goes on with the bulk restore where this one stopped (each round starts
        from the persisted offsets). The step ends with Faust's own "rebalance again", which its
        recovery task answers by starting over once its recovery signal is set; the rebalance's
        generation, the restore's tally and readiness (false until the actives are restored)
        carry over.

        Handing the rest to Faust's reader instead would read it record by record, more than
        ten times slower; a rebalance meanwhile restarts the steps with the new assignment."""
        log.info("bulk restore: the round's %.0fs are over; going on in another round", self.round_budget_s())
        self.run_steps_again()


class _RecoveringPartition:
    """One partition of a round of the bulk restore: the database the store held open when the
    round began, kept for the round. A rebalance meanwhile may revoke the partition (the store
    lets go of its database) before it cancels the round; the round's last checkpoint then
    flushes and records its offset in the same database it wrote the rows to, instead of
    having the store open it again."""

    def __init__(self, store: RocksDBStore, tp: TP, offsets: Counter[TP]) -> None:
        self.tp = tp
        #: Faust's recovery offsets (active or standby) for this partition, moved along with the database's.
        self.offsets = offsets
        self._db = store_partition_db(store, tp.partition)

    def db(self) -> Rdict:
        return self._db

    def persisted_offset(self) -> int | None:
        return persisted_offset(self._db)

    def set_persisted_offset(self, offset: int) -> None:
        set_persisted_offset(self._db, offset)
        self.offsets[self.tp] = offset


def _can_open(store: RocksDBStore, tp: TP) -> bool:
    """A standby's database is opened on first use and may be held by another worker on a shared data dir."""
    try:
        store_partition_db(store, tp.partition)
    except Exception as exc:  # rocksdict raises a plain Exception for a held lock
        log.info("not restoring %s in bulk: its database cannot be opened (%s)", tp, exc)
        return False
    return True


class BulkRestoringTableManager(TableManagerHooks):
    """Faust's table manager with :class:`BulkRestoringRecovery` as its recovery service."""

    recovery_class = BulkRestoringRecovery
