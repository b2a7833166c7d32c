"""A service's handlers run in memory, as Kafka Streams' ``TopologyTestDriver`` runs a topology:
records piped in, the records the handlers send and the rows they write read back, with no
broker and no Faust worker.

The driver wraps an :class:`~shared.engine.Engine` whose service has registered its tables and
handlers (build the service as usual, with ``Settings(data_dir=tmp_path)``), and replaces only
the engine's Kafka clients: its producer, its read-back consumer and its transactional producers
write to and read from topic partitions kept as lists here. Everything between them is the
engine's own: :class:`~shared.engine._durable.OrderedInput` (replays dropped, next-offset rows),
:class:`~shared.engine._batch.InputBatch` and :func:`~shared.engine._batch.commit` (sends, then
the changelog rows, then the local RocksDB tables, then the after-commit callbacks). So the
changelog topics receive the rows and next-offset rows a worker would send, and the tables are
the service's Faust tables (RocksDB in the data dir).

Each batch goes through the same task as on a worker (:meth:`Task.process
<shared.engine._task.Task.process>`): its records in order, the handler, the commit, the
batch's status; only the consumer around it is the driver's.

Records a handler sends to a topic that has a handler (the service's internal topics, or an
input it also writes, such as a reroute) are handed to that handler in turn by :meth:`process`,
as the worker's consumer would; every other topic only collects them for :meth:`outputs`.

The driver has a clock (:attr:`TopologyDriver.clock`, seconds from 0) that only
:meth:`TopologyDriver.advance` moves: the engine's timers (``Engine.timer``) run when their
interval has passed on it, and tickers read it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import TypedDict, TypeVar, Unpack, cast

from aiokafka import TopicPartition

from shared.engine._batch import Headers, InputBatch
from shared.engine._durable import Backfill, DurableTable, InRecord, next_offset_key, state_items
from shared.engine._engine import Engine, faust_app
from shared.engine._instance import Instance
from shared.engine._partitioning import partition_for
from shared.engine._producer import BatchProducer, Outgoing, PartitionTransactions, Retry, record_too_large
from shared.engine._restore import ChangelogReader, PartitionTarget, RestoreResult, write_batch
from shared.engine._task import Registration, StepFailed, Task, TaskClients, TaskState
from shared.settings import Settings

T = TypeVar("T")


class RecordFields(TypedDict, total=False):
    """A record's fields besides its topic, key and value, as :meth:`TopologyDriver.send` takes them."""

    headers: Headers
    partition: int | None
    timestamp_ms: int | None


#: Rounds of :meth:`TopologyDriver.process` after which handlers that keep sending to each
#: other are taken for a loop.
MAX_ROUNDS = 100


class MemoryTopics:
    """Topic partitions as lists of records, offsets from 0, in the order they were appended."""

    def __init__(self, default_partitions: int, partitions: Mapping[str, int]) -> None:
        self.default_partitions = default_partitions
        self.partitions = dict(partitions)
        self.logs: dict[tuple[str, int], list[InRecord]] = {}
        #: Every record appended, in order, across topics.
        self.appended: list[InRecord] = []

    def partition_count(self, topic: str) -> int:
        return self.partitions.get(topic, self.default_partitions)

    def append(self, record: Outgoing) -> InRecord:
        """``record`` at the end of its partition (a keyed record without a partition goes where
        the engine's partitioner puts it, one without a key to partition 0)."""
        partition = record.partition
        if partition is None:
            partition = partition_for(record.key, self.partition_count(record.topic)) if record.key is not None else 0
        log = self.logs.setdefault((record.topic, partition), [])
        timestamp = record.timestamp_ms if record.timestamp_ms is not None else int(time.time() * 1000)
        appended = InRecord(record.topic, partition, len(log), record.key, record.value, list(record.headers or ()), timestamp)
        log.append(appended)
        self.appended.append(appended)
        return appended

    def log(self, topic: str, partition: int) -> list[InRecord]:
        return self.logs.get((topic, partition), [])


class MemoryProducer(BatchProducer):
    """The engine's producer, appending to :class:`MemoryTopics`; every send is acknowledged."""

    def __init__(self, settings: Settings, topics: MemoryTopics) -> None:
        super().__init__(settings, client_id="topology-driver")
        self.topics = topics

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def send(self, records: Sequence[Outgoing], what: str, before_retry: Retry | None = None) -> dict[tuple[str, int], int]:
        last: dict[tuple[str, int], int] = {}
        for record in records:
            appended = self.topics.append(record)
            last[(appended.topic, appended.partition)] = appended.offset
        return last

    async def deliver_each(self, records: Sequence[Outgoing], timeout_s: float) -> list[str | None]:
        await self.send(records, "deliver_each")
        return [None] * len(records)

    async def unsendable(self, records: Sequence[Outgoing], timeout_s: float) -> list[str | None]:
        return [record_too_large(record) for record in records]


class MemoryTransactions(PartitionTransactions):
    """exactly_once's per-partition transactions, each one committed at once into :class:`MemoryTopics`."""

    def __init__(self, settings: Settings, records: MemoryProducer) -> None:
        super().__init__(settings, group_id="topology-driver", client_id="topology-driver", records=records)
        #: Input partitions whose producer was initialised again after a failed commit, in order.
        self.renewed: list[tuple[str, int]] = []

    async def assign(self, tps: Sequence[tuple[str, int]]) -> None:
        pass

    async def revoke(self, tps: Sequence[tuple[str, int]]) -> None:
        pass

    async def commit(
        self, topic: str, partition: int, records: Sequence[Outgoing], next_offset: int, what: str, reached: Callable[[str], None]
    ) -> dict[tuple[str, int], int]:
        last = await self.records.send(records, what)
        reached("sent")
        self.committed += 1
        return last

    async def discard(self, topic: str, partition: int, timeout_s: float) -> None:
        pass

    async def renew(self, topic: str, partition: int, timeout_s: float) -> None:
        self.renewed.append((topic, partition))


class MemoryBackfill(Backfill):
    """The engine's read-back consumer, reading :class:`MemoryTopics`."""

    def __init__(self, settings: Settings, topics: MemoryTopics) -> None:
        super().__init__(settings)
        self.topics = topics

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def log_start(self, topic: str, partition: int) -> int:
        return 0

    async def log_end(self, topic: str, partition: int) -> int:
        return len(self.topics.log(topic, partition))

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[InRecord]:
        return self.topics.log(topic, partition)[start:end]


class MemoryChangelogs(ChangelogReader):
    """The engine's changelog reader, restoring table partitions from :class:`MemoryTopics`."""

    def __init__(self, settings: Settings, topics: MemoryTopics) -> None:
        super().__init__(settings)
        self.topics = topics

    async def stop(self) -> None:
        pass

    async def restore(
        self, targets: Mapping[TopicPartition, PartitionTarget], min_lag: int, *, budget_s: float | None = None
    ) -> RestoreResult:
        records = 0
        for tp, target in targets.items():
            start = (target.persisted_offset() or -1) + 1
            records += write_batch(target, list(self.topics.log(tp.topic, tp.partition)[start:]))
        return RestoreResult(records, 0.0, len(targets))


class TableView:
    """Reads of one of the service's tables as its handlers left it."""

    def __init__(self, table: DurableTable, partitions: int) -> None:
        self.table = table
        self.partitions = partitions

    def get(self, key: bytes, *, partition: int | None = None) -> bytes | None:
        """The row of ``key`` (by default in the partition the engine's partitioner gives it)."""
        return self.table.get(partition_for(key, self.partitions) if partition is None else partition, key)

    def items(self, partition: int | None = None) -> list[tuple[bytes, bytes]]:
        """The service's rows (not the engine's) of ``partition``, or of every partition, in key order."""
        chosen = range(self.partitions) if partition is None else (partition,)
        return [item for p in chosen for item in state_items(self.table.table, p)]

    def next_offset(self, topic: str, partition: int) -> int | None:
        """The next offset of ``topic``'s ``partition`` a handler keeps in this table."""
        raw = self.table.get(partition, next_offset_key(topic))
        return int(raw) if raw is not None else None


class UndeclaredSink(AssertionError):
    """A handler sent to a topic it did not declare (``Engine.handler(..., sends=...)``)."""


def undeclared(registration: Registration | None, batch: InputBatch) -> None:
    """Raise :class:`UndeclaredSink` when ``batch`` sent to a topic its handler did not declare
    (a handler that declared none, or one named at run time, is not checked)."""
    if registration is None or registration.sends is None or any(s.startswith("<") for s in registration.sends):
        return
    declared = set(registration.sends)
    for record in batch.sends:
        if record.topic not in declared:
            raise UndeclaredSink(
                f"{registration.name} sent to {record.topic!r}, which it does not declare (sends={list(registration.sends)})"
            )


class DriverInstance(Instance):
    """The instance a driven engine is: recovered, with no consumer group to wait for."""

    def ready(self) -> bool:
        return True


class TopologyDriver:
    """Runs ``engine``'s handlers on records piped in; see the module docs.

    ``partitions``: partition counts of topics that do not have the settings' ``topic_partitions``.
    The driver runs its own event loop: use it from synchronous tests, and :meth:`run` for the
    service's coroutines (an HTTP command's send, say).
    """

    def __init__(self, engine: Engine, *, partitions: Mapping[str, int] | None = None) -> None:
        self.engine = engine
        settings = engine.settings
        self.topics = MemoryTopics(settings.topic_partitions, partitions or {})
        producer = MemoryProducer(settings, self.topics)
        backfill = MemoryBackfill(settings, self.topics)
        engine.producer = producer
        engine.batch_producer = producer
        engine.backfill = backfill
        engine.changelogs = MemoryChangelogs(settings, self.topics)
        engine.instance = DriverInstance(faust_app(engine), engine.instance.url)
        if engine.transactions is not None:
            engine.transactions = MemoryTransactions(settings, producer)
        for registration in engine.registrations:
            if registration.order is not None:
                registration.order.backfill = backfill
        #: Per input partition, the offset of the next record to hand to its handler.
        self.positions: dict[tuple[str, int], int] = {}
        #: Seconds since the driver started, moved by :meth:`advance` only.
        self.clock = 0.0
        engine.clock = lambda: self.clock
        #: Per timer of the engine, when it runs next on :attr:`clock`.
        self._due = {timer: timer.interval_s for timer in engine.timers}
        self._loop = asyncio.new_event_loop()

    # -- input -----------------------------------------------------------------------------------

    def send(self, topic: str, key: bytes | None, value: bytes | None, **fields: Unpack[RecordFields]) -> InRecord:
        """Append a record to ``topic`` without handing it over yet: records sent before one
        :meth:`process` reach their handler as one batch per partition."""
        return self.topics.append(Outgoing(topic, key, value, **fields))

    def pipe(self, topic: str, key: bytes | None, value: bytes | None, **fields: Unpack[RecordFields]) -> InRecord:
        """:meth:`send` a record, then :meth:`process` it and all that follows from it."""
        record = self.send(topic, key, value, **fields)
        self.process()
        return record

    def process(self) -> list[InputBatch]:
        """Hand every record not handed over yet to its topic's handler, one batch per input
        partition, until no handler has anything left; returns the batches committed.

        A handler that raises commits nothing of its batch and the error propagates; its records
        stay to be handed over again, as a worker's restart would."""
        return self.run(self._process())

    def advance(self, seconds: float) -> list[InputBatch]:
        """Move the clock ``seconds`` on, running each engine timer as many times as its interval
        passed, in time order, with a :meth:`process` after each run; returns the batches committed."""
        return self.run(self._advance(seconds))

    async def _advance(self, seconds: float) -> list[InputBatch]:
        if seconds < 0:
            raise ValueError("the clock does not go back")
        end = self.clock + seconds
        for timer in self.engine.timers:
            self._due.setdefault(timer, self.clock + timer.interval_s)
        committed = await self._process()
        while self._due and (timer := min(self._due, key=lambda t: self._due[t])) and self._due[timer] <= end:
            self.clock = self._due[timer]
            self._due[timer] += timer.interval_s
            await timer.run()
            committed += await self._process()  # as a worker's consumer goes on meanwhile
        self.clock = end
        return committed

    def task(self, topic: str, partition: int) -> Task:
        """The task that runs ``topic``'s ``partition`` (running once asked for, as after a restore)."""
        task = self.engine.task(topic, partition)
        if task.state in (TaskState.CREATED, TaskState.SUSPENDED):
            task.restore()
        task.restored()
        return task

    def rewind(self, topic: str, partition: int, offset: int) -> None:
        """Hand ``topic``'s ``partition`` over again from ``offset`` at the next :meth:`process`,
        as a consumer does after a rebalance or a restart before its last commit."""
        self.positions[(topic, partition)] = offset

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run a coroutine of the service on the driver's loop."""
        return self._loop.run_until_complete(awaitable)

    async def _process(self) -> list[InputBatch]:
        committed: list[InputBatch] = []
        for _ in range(MAX_ROUNDS):
            pending = list(self._pending())
            if not pending:
                return committed
            for topic, partition, records in pending:
                batch = await self._deliver(topic, partition, records)
                self.positions[(topic, partition)] = records[-1].offset + 1
                if batch is not None:
                    committed.append(batch)
        raise RuntimeError(f"handlers still sending to each other after {MAX_ROUNDS} rounds")

    def _pending(self) -> Iterator[tuple[str, int, list[InRecord]]]:
        for (topic, partition), log in list(self.topics.logs.items()):
            position = self.positions.get((topic, partition), 0)
            if self.engine.registration_for(topic) is not None and position < len(log):
                yield topic, partition, log[position:]

    async def _deliver(self, topic: str, partition: int, records: list[InRecord]) -> InputBatch | None:
        """What the engine does with a fetched batch: its task's :meth:`~Task.process`. A failed
        step raises its own error, as the handler or the client raised it."""
        engine = self.engine
        assert engine.registration_for(topic) is not None, f"{topic!r} has no handler"
        clients = TaskClients(producer=engine.producer, transactions=engine.transactions)
        try:
            batch = await self.task(topic, partition).process(records, clients)
        except StepFailed as failed:
            raise cast(BaseException, failed.__cause__) from None
        if batch is not None:
            undeclared(engine.registration_for(topic), batch)
        return batch

    # -- output ----------------------------------------------------------------------------------

    def outputs(self, topic: str, partition: int | None = None) -> list[InRecord]:
        """Every record on ``topic`` (or one partition of it), piped in or sent, in the order appended."""
        return [r for r in self.topics.appended if r.topic == topic and (partition is None or r.partition == partition)]

    def table(self, name: str) -> TableView:
        """The service's table ``name`` (as declared with ``Engine.table``)."""
        faust_table = faust_app(self.engine).tables[name]
        durable = DurableTable(faust_app(self.engine), faust_table)
        return TableView(durable, faust_table.partitions or self.engine.settings.topic_partitions)

    def changelog(self, name: str) -> list[InRecord]:
        """What the commits sent to table ``name``'s changelog: its rows and the next-offset rows."""
        return self.outputs(self.table(name).table.changelog)

    # -- life cycle ------------------------------------------------------------------------------

    def close(self) -> None:
        self._loop.close()

    def __enter__(self) -> TopologyDriver:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
