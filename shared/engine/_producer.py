"""The engine's producer: a batch's records sent as whole record batches per partition.

Sending record by record through aiokafka costs a coroutine, a metadata lookup and a
future per record, more than the handlers' own work per record. A committed batch
knows all its records at once, so they are grouped per topic partition (keyed records
by the default partitioner, murmur2 as in Kafka's clients) and appended to aiokafka
record batches, one future per record batch. Acknowledgements come back as the offset
of each partition's last record, which is what the changelog offset of a table
partition needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, KafkaTimeoutError, ProducerFenced
from aiokafka.protocol.produce import ProduceRequest

from shared.engine._clients import client_kwargs, started_when_reachable
from shared.engine._durable import acknowledged
from shared.engine._partitioning import partition_for
from shared.metrics import TRANSACTION_COMMIT_SECONDS, TRANSACTIONS, TRANSACTIONS_FENCED
from shared.settings import Settings

log = logging.getLogger(__name__)

#: Largest record batch (bytes); under the broker's default message.max.bytes.
MAX_BATCH_BYTES = 900_000


@dataclass(slots=True)
class Outgoing:
    """A record to send; ``partition`` None means by key (or any partition for no key)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] | None = None
    partition: int | None = None
    timestamp_ms: int | None = None  # None: now


class TopicTrackingProducer(AIOKafkaProducer):  # type: ignore[misc]  # aiokafka is untyped
    """An aiokafka producer that has its client keep metadata for every topic it sends to.

    aiokafka's client refreshes metadata for all topics until it tracks a topic, and from then
    on only for the topics it tracks. It tracks a topic only when a send finds no metadata for
    it. So a topic first seen in an all-topics refresh (a changelog created before the worker
    started, the inbox, the parking lot) is used without being tracked; the first send to a
    topic created later switches the client to tracked topics only, and the next refresh drops
    the untracked ones. Records for them still queued then have a partition without a known
    leader: the sender keeps asking for the same metadata and the records wait until the
    request timeout, with no error logged. Here each topic is added to the client's tracked
    topics (aiokafka's ``add_topic``) before its first send, so the refreshes keep it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tracked_topics: set[str] = set()

    def track(self, topic: str) -> None:
        """Have the client keep ``topic``'s metadata from now on (a refresh starts if it is new)."""
        if topic not in self.tracked_topics:
            self.tracked_topics.add(topic)
            refreshed = self.client.add_topic(topic)
            # The refresh is not awaited: a send waits for the metadata it needs itself.
            refreshed.add_done_callback(_refresh_done)

    async def send(self, topic: str, *args: Any, **kwargs: Any) -> Any:
        self.track(topic)
        return await super().send(topic, *args, **kwargs)

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> Any:
        self.track(topic)
        return await super().send_batch(batch, topic, partition=partition)


def _refresh_done(refreshed: asyncio.Future[Any]) -> None:
    if not refreshed.cancelled() and (failure := refreshed.exception()) is not None:
        log.debug("metadata refresh for a newly tracked topic: %r", failure)


def record_too_large(record: Outgoing) -> str | None:
    """Why ``record`` cannot fit in one record batch, or ``None`` (a close upper estimate of its size)."""
    size = len(record.key or b"") + len(record.value or b"") + 64
    size += sum(len(name) + len(value) + 8 for name, value in record.headers or ())
    if size > MAX_BATCH_BYTES:
        return f"record of about {size} bytes is larger than a record batch ({MAX_BATCH_BYTES} bytes)"
    return None


#: Tries to enqueue one record batch (each waits up to the producer's request timeout).
ENQUEUE_TRIES = 3

#: Awaited before a record batch is queued again; raises to stop the send.
Retry = Callable[[], Awaitable[None]]


async def _enqueue(producer: AIOKafkaProducer, batch: Any, topic: str, partition: int, before_retry: Retry | None = None) -> Any:
    """``producer.send_batch``, tried again when the batch could not be queued in time.

    aiokafka queues a record batch once the partition's previous batch has been drained,
    waiting at most the request timeout measured on the monotonic clock, which goes on while
    the process is stopped (SIGSTOP, a frozen VM): a send that was waiting when the process
    stopped fails at once when it continues, and the worker would stop for it. Nothing was
    queued, so queuing the same batch again sends nothing twice. ``before_retry`` may raise to
    send nothing more (a batch's commit checks there that its consumer is still a member)."""
    for attempt in range(1, ENQUEUE_TRIES + 1):
        try:
            return await producer.send_batch(batch, topic, partition=partition)
        except KafkaTimeoutError:
            if attempt == ENQUEUE_TRIES:
                raise
            log.warning("a record batch for %s[%d] could not be queued in time; trying again", topic, partition)
            if before_retry is not None:
                await before_retry()
    raise AssertionError("unreachable")


#: Awaited right before each produce request of a gated producer leaves; ``False`` refuses it.
Gate = Callable[[], Awaitable[bool]]


class WriteRefused(KafkaError):  # type: ignore[misc]  # aiokafka's errors are untyped
    """A produce request held back by its producer's gate: none of its records was sent."""

    retriable = False  # aiokafka fails the request's batches rather than queue them again
    invalid_metadata = False


def gate_produce_requests(producer: AIOKafkaProducer, gate: Gate) -> None:
    """Have ``gate`` pass each produce request of ``producer`` right before it is written to the
    broker's connection (aiokafka writes it there with no await in between once the connection
    is up); a refused one fails its record batches with :class:`WriteRefused`, sending nothing."""
    client = producer.client
    send = client.send

    async def gated_send(node_id: int, request: Any, **kwargs: Any) -> Any:
        if isinstance(request, ProduceRequest) and not await gate():
            raise WriteRefused("the batch's consumer may no longer be a member of the group: not sent")
        return await send(node_id, request, **kwargs)

    client.send = gated_send


class BatchProducer:
    """aiokafka producers (acks=all; ``connections`` of them, taken in turn by :meth:`send`) that
    send lists of records as record batches. aiokafka holds one record batch per partition and
    one request in flight per broker: through one producer, the commits of batches that run
    side by side and write the same partitions (every validator command batch writes every
    outcomes partition) waited for a request each, one after the other.

    With a ``gate``, every produce request waits for it right before it leaves and is failed
    (:class:`WriteRefused`) when it refuses: the engine's producer for at-least-once batch
    commits is gated on the consumer's membership (see ``BatchConsumer.may_write``)."""

    def __init__(self, settings: Settings, client_id: str, gate: Gate | None = None, connections: int = 1) -> None:
        self.settings = settings
        self.client_id = client_id
        self.gate = gate
        self.connections = connections
        self._producer: AIOKafkaProducer | None = None
        #: Every producer :meth:`send` takes in turn (the first is :attr:`_producer`).
        self._pool: list[AIOKafkaProducer] = []
        self._turn = 0
        self._partitions: dict[str, int] = {}
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        async with self._lock:
            if self._producer is None:
                pool = [await self._started(i) for i in range(self.connections)]
                self._pool, self._producer = pool, pool[0]

    async def _started(self, i: int) -> AIOKafkaProducer:
        client_id = self.client_id if i == 0 else f"{self.client_id}-{i}"
        producer = await started_when_reachable(
            lambda: TopicTrackingProducer(
                **client_kwargs(self.settings),
                client_id=client_id,
                acks="all",
                max_batch_size=MAX_BATCH_BYTES,
                max_request_size=4 * 1024 * 1024,
                linger_ms=0,
            ),
            f"producer {client_id}",
        )
        if self.gate is not None:
            gate_produce_requests(producer, self.gate)
        return producer

    async def stop(self) -> None:
        pool, self._pool, self._producer = self._pool, [], None
        for producer in pool:
            await producer.stop()

    async def _partition_count(self, topic: str) -> int:
        count = self._partitions.get(topic)
        if count is None:
            assert self._producer is not None
            count = self._partitions[topic] = len(await self._producer.partitions_for(topic))
        return count

    async def unsendable(self, records: Sequence[Outgoing], timeout_s: float) -> list[str | None]:
        """Per record, why it cannot be sent in a batch commit, or ``None``: a topic the client
        finds no metadata for within ``timeout_s`` (missing, or not ours to describe), or a record
        too large for one record batch. Inside a transaction one such send would abort the whole
        batch again and again, so a caller that can give a record another fate asks first."""
        if self._producer is None:
            await self.start()
        topic_errors: dict[str, str | None] = {}
        for topic in {record.topic for record in records}:
            if topic in self._partitions:
                topic_errors[topic] = None
                continue
            try:
                async with asyncio.timeout(timeout_s):
                    await self._partition_count(topic)
                topic_errors[topic] = None
            except Exception as exc:  # unknown topic, authorisation, timeout
                topic_errors[topic] = f"topic {topic!r} is not available: {type(exc).__name__}: {exc}".rstrip(": ")
        return [topic_errors[record.topic] or record_too_large(record) for record in records]

    async def send(self, records: Sequence[Outgoing], what: str, before_retry: Retry | None = None) -> dict[tuple[str, int], int]:
        """Send ``records`` (in order per partition) and wait for every acknowledgement; returns the
        offset of the last record per (topic, partition). The first failure raises.
        ``before_retry`` is awaited before a record batch is queued again (see :func:`_enqueue`)."""
        if not records:
            return {}
        if self._producer is None:
            await self.start()
        # Each send's records are acknowledged before the sender sends more (a commit's steps
        # wait for theirs), so sends may take any producer: no partition's order depends on it.
        self._turn = (self._turn + 1) % len(self._pool)
        return await self.send_with(self._pool[self._turn], records, what, before_retry)

    async def send_with(
        self, producer: AIOKafkaProducer, records: Sequence[Outgoing], what: str, before_retry: Retry | None = None
    ) -> dict[tuple[str, int], int]:
        """:meth:`send` through ``producer`` (a transactional one, inside its transaction)."""
        if not records:
            return {}
        if self._producer is None:
            await self.start()  # for the partition counts of keyed records
        groups: dict[tuple[str, int], list[Outgoing]] = {}
        for record in records:
            partition = record.partition
            if partition is None:
                count = await self._partition_count(record.topic)
                partition = partition_for(record.key, count) if record.key is not None else random.randrange(count)
            group = groups.get((record.topic, partition))
            if group is None:
                group = groups[(record.topic, partition)] = []
            group.append(record)
        built: list[tuple[tuple[str, int], list[tuple[int, Any]]]] = []
        for (topic, partition), group in groups.items():
            batches: list[tuple[int, Any]] = []  # (records, record batch) in order
            batch = producer.create_batch()
            n = 0
            for record in group:
                headers = list(record.headers) if record.headers else []
                if batch.append(key=record.key, value=record.value, timestamp=record.timestamp_ms, headers=headers) is None:
                    # full: it goes first, and the next record batch starts with this record
                    if n == 0:
                        raise ValueError(f"a record for {topic} does not fit in one record batch")
                    batches.append((n, batch))
                    batch = producer.create_batch()
                    n = 0
                    if batch.append(key=record.key, value=record.value, timestamp=record.timestamp_ms, headers=headers) is None:
                        raise ValueError(f"a record for {topic} does not fit in one record batch")
                n += 1
            if n:
                batches.append((n, batch))
            built.append(((topic, partition), batches))

        async def enqueue_in_order(tp: tuple[str, int], batches: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
            return [(n, await _enqueue(producer, batch, tp[0], tp[1], before_retry)) for n, batch in batches]

        # aiokafka takes a partition's record batch only once the one it holds for that partition
        # has left in a request: queued one partition after the other, a send behind other
        # batches' (another lane's records for the same partitions) waited for a request per
        # partition in turn. Queued side by side, it waits for one.
        queued = await asyncio.gather(*(enqueue_in_order(tp, batches) for tp, batches in built))
        pending = [(tp, n, fut) for (tp, _), futures in zip(built, queued, strict=True) for n, fut in futures]
        metadata = await acknowledged([fut for _, _, fut in pending], f"{what}: {len(records)} records")
        last: dict[tuple[str, int], int] = {}
        for (tp, n, _), meta in zip(pending, metadata, strict=True):
            last[tp] = max(last.get(tp, -1), int(meta.offset) + n - 1)
        return last

    async def deliver_each(self, records: Sequence[Outgoing], timeout_s: float) -> list[str | None]:
        """See :meth:`shared.engine.Engine.deliver_each`.

        The records go out as record batches per partition, as :meth:`send` sends them, rather
        than through aiokafka's ``send`` one by one (a coroutine, a metadata look-up and a future
        per record cost more than a redelivery's own work). Each record's outcome is that of its
        record batch: a topic without metadata within ``timeout_s`` fails only its own records,
        before anything is sent, and a record batch not queued or not acknowledged in time fails
        the records in it; the other partitions' records go on. A record larger than a record
        batch goes on its own through aiokafka's ``send``, in its place among its partition's
        records, and fails alone when the producer refuses it (larger than its request size)."""
        if self._producer is None:
            await self.start()
        producer = self._producer
        assert producer is not None
        errors: list[str | None] = [None] * len(records)
        unavailable: dict[str, str] = {}
        for topic in {record.topic for record in records}:
            if topic not in self._partitions:
                try:
                    async with asyncio.timeout(timeout_s):
                        await self._partition_count(topic)
                except Exception as exc:  # unknown topic, authorisation, timeout: that topic's records' outcome
                    unavailable[topic] = f"{type(exc).__name__}: {exc}".rstrip(": ")
        groups: dict[tuple[str, int], list[int]] = {}
        for i, record in enumerate(records):
            error = unavailable.get(record.topic)
            if error is not None:
                errors[i] = error
                continue
            partition = record.partition
            if partition is None:
                count = self._partitions[record.topic]
                partition = partition_for(record.key, count) if record.key is not None else random.randrange(count)
            group = groups.get((record.topic, partition))
            if group is None:
                group = groups[(record.topic, partition)] = []
            group.append(i)
        pending: list[tuple[list[int], asyncio.Future[Any]]] = []

        async def enqueue(members: list[int], queued: Awaitable[asyncio.Future[Any]]) -> None:
            try:
                future = await asyncio.wait_for(queued, timeout_s)
            except Exception as exc:  # not queued in time (nothing of it was sent), or refused
                for i in members:
                    errors[i] = f"{type(exc).__name__}: {exc}".rstrip(": ")
            else:
                pending.append((members, future))

        for (topic, partition), indexes in groups.items():
            batch = producer.create_batch()
            members: list[int] = []
            for i in indexes:
                record = records[i]
                headers = list(record.headers) if record.headers else []
                if batch.append(key=record.key, value=record.value, timestamp=record.timestamp_ms, headers=headers) is None:
                    if members:  # full: send it, and start the next record batch
                        await enqueue(members, producer.send_batch(batch, topic, partition=partition))
                        batch = producer.create_batch()
                        members = []
                    if batch.append(key=record.key, value=record.value, timestamp=record.timestamp_ms, headers=headers) is None:
                        single = producer.send(
                            topic,
                            record.value,
                            key=record.key,
                            partition=partition,
                            timestamp_ms=record.timestamp_ms,
                            headers=headers,
                        )
                        await enqueue([i], single)  # larger than a record batch: on its own
                        continue
                members.append(i)
            if members:
                await enqueue(members, producer.send_batch(batch, topic, partition=partition))
        if pending:
            await asyncio.wait([fut for _, fut in pending], timeout=timeout_s)
        for members, fut in pending:
            if not fut.done():
                error = f"not acknowledged within {timeout_s:.0f}s"
            elif fut.cancelled():
                error = "send cancelled"
            elif (failure := fut.exception()) is not None:
                error = f"{type(failure).__name__}: {failure}"
            else:
                continue
            for i in members:
                errors[i] = error
        return errors


#: transaction.timeout.ms of the transactional producers. A transaction lasts one batch commit:
#: its records, their acknowledgements, the input offset and the commit, normally well under a
#: second. Until it ends, committed readers of every partition it wrote wait at its first
#: record. When its worker dies, the transaction is aborted by whichever comes first: the next
#: owner of the input partition initialising the same transactional id (at once after a
#: restart, within the session timeout when another instance takes over), or the broker after
#: this timeout. Kept short (Kafka Streams' default for exactly-once, 10 s) so that the readers
#: of a worker that nobody replaces wait at most this long; a commit that really takes longer
#: (a broker that stalls) is aborted by the broker, fails, and the worker stops and redoes the
#: batch: a restart, never a wrong result.
TRANSACTION_TIMEOUT_MS = 10_000


def transactional_id(group_id: str, topic: str, partition: int) -> str:
    """One transactional id per input partition, the same on every instance (Kafka Streams'
    first exactly-once design): whoever owns the partition next fences whoever owned it before."""
    return f"{group_id}.{topic}.{partition}"


class NoTransactionalProducer(RuntimeError):
    """A batch's partition has no transactional producer here: it was closed with a revocation that
    raced the batch's delivery, or after a failed commit. The engine delivers the batch again once
    it knows the partition is still its own, with a producer initialised afresh."""


class PartitionTransactions:
    """One transactional producer per input partition this instance owns.

    aiokafka 0.14 sends ``TxnOffsetCommit`` v0, which carries no group generation, so the broker
    cannot refuse a stale owner's offsets by generation (KIP-447). Fencing is by transactional
    id instead: :meth:`assign` initialises a producer per newly assigned input partition
    (``InitProducerId``), which bumps the id's epoch, aborts the previous owner's open
    transaction and makes every later send or commit of the previous owner fail
    (``ProducerFenced``). It runs before Faust restores the partition's tables, so the
    restore (read_committed) sees exactly the committed transactions.
    """

    def __init__(self, settings: Settings, group_id: str, client_id: str, records: BatchProducer, service: str = "") -> None:
        self.settings = settings
        self.service = service
        self.group_id = group_id
        self.client_id = client_id
        self.records = records  # groups records into record batches (and knows partition counts)
        self._producers: dict[tuple[str, int], AIOKafkaProducer] = {}
        self.committed = 0
        self.aborted = 0
        self.fenced = 0

    def _make(self, topic: str, partition: int) -> AIOKafkaProducer:
        return TopicTrackingProducer(
            **client_kwargs(self.settings),
            client_id=f"{self.client_id}-{topic}-{partition}",
            acks="all",
            enable_idempotence=True,
            transactional_id=transactional_id(self.group_id, topic, partition),
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
            max_batch_size=MAX_BATCH_BYTES,
            max_request_size=4 * 1024 * 1024,
            linger_ms=0,
        )

    async def assign(self, tps: Sequence[tuple[str, int]]) -> None:
        """Initialise (and so fence) the producer of each partition in ``tps`` not started yet."""
        todo = [tp for tp in tps if tp not in self._producers]

        async def start(tp: tuple[str, int]) -> None:
            producer = await started_when_reachable(lambda: self._make(*tp), f"transactional producer {tp[0]}[{tp[1]}]")
            self._producers[tp] = producer

        await asyncio.gather(*(start(tp) for tp in todo))
        if todo:
            log.info("transactional producers initialised for %d input partitions", len(todo))

    async def revoke(self, tps: Sequence[tuple[str, int]]) -> None:
        """Close the producers of partitions given up; their next owner initialises its own."""
        producers = [p for p in (self._producers.pop(tp, None) for tp in tps) if p is not None]
        await asyncio.gather(*(p.stop() for p in producers), return_exceptions=True)

    async def stop(self) -> None:
        await self.revoke(list(self._producers))

    async def discard(self, topic: str, partition: int, timeout_s: float) -> None:
        """Close the producer of ``topic``'s ``partition`` after a failed commit, as Kafka Streams
        closes a task dirty: a producer aiokafka put in its fatal state cannot start another
        transaction, and one whose commit had no answer holds a transaction of unknown outcome.
        Until :meth:`renew`, the partition has no producer."""
        producer = self._producers.pop((topic, partition), None)
        if producer is not None:
            with contextlib.suppress(Exception):  # a broken producer: its connections go either way
                await asyncio.wait_for(producer.stop(), timeout_s)

    async def renew(self, topic: str, partition: int, timeout_s: float) -> None:
        """A fresh producer for ``topic``'s ``partition`` (any old one closed first), initialised
        within ``timeout_s`` or not at all (the error raises). Its ``InitProducerId`` completes
        or aborts the previous transaction of the id on the coordinator before it answers, so
        a read_committed reader of the partitions that transaction wrote sees its outcome
        afterwards. Only for a partition this consumer still owns: it fences any other owner."""
        await self.discard(topic, partition, timeout_s)
        producer = self._make(topic, partition)
        try:
            await asyncio.wait_for(producer.start(), timeout_s)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), timeout_s)
            raise
        self._producers[(topic, partition)] = producer
        log.info("transactional producer of %s[%d] initialised again", topic, partition)

    async def commit(
        self, topic: str, partition: int, records: Sequence[Outgoing], next_offset: int, what: str, reached: Callable[[str], None]
    ) -> dict[tuple[str, int], int]:
        """``records`` and the input's ``next_offset`` as one transaction, committed; returns the
        offset of the last record per (topic, partition). Any failure aborts the transaction (when
        the producer still can) and raises: nothing of it is visible to committed readers."""
        producer = self._producers.get((topic, partition))
        if producer is None:
            raise NoTransactionalProducer(f"{what}: no transactional producer for {topic}[{partition}]")
        try:
            await producer.begin_transaction()
        except AssertionError as exc:
            # aiokafka asserts when a producer in its fatal state (fenced by the partition's
            # next owner, or its transaction timed out) is asked for another transaction.
            self._fenced()
            log.warning("%s: the transactional producer of %s[%d] was fenced; not committing", what, topic, partition)
            raise ProducerFenced(f"{transactional_id(self.group_id, topic, partition)} was fenced ({exc})") from exc
        try:
            last = await self.records.send_with(producer, records, what)
            reached("sent")
            await producer.send_offsets_to_transaction({TopicPartition(topic, partition): next_offset}, self.group_id)
            ending = time.perf_counter()
            await producer.commit_transaction()
        except BaseException as exc:
            self.aborted += 1
            TRANSACTIONS.labels(self.service, "aborted").inc()
            if isinstance(exc, ProducerFenced):
                self._fenced()
            with contextlib.suppress(Exception):  # fenced or broken: the broker aborts it (fencing, timeout)
                await asyncio.wait_for(producer.abort_transaction(), TRANSACTION_TIMEOUT_MS / 1000)
            raise
        TRANSACTION_COMMIT_SECONDS.labels(self.service).observe(time.perf_counter() - ending)
        self.committed += 1
        TRANSACTIONS.labels(self.service, "committed").inc()
        return last

    def _fenced(self) -> None:
        self.fenced += 1
        TRANSACTIONS_FENCED.labels(self.service).inc()
