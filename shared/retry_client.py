"""Ordered retries for users' own Python consumers (see docs/retry_scheduler.md, "Ordered
retries"): a consumer of one ordered topic and of its retry topic that keeps each key's
records in order through failures.

- A record that fails goes to ``dead-letters`` (the contract's headers), and its key is
  blocked here at once, before the scheduler has read it.
- A record of a blocked key is not processed: it goes to ``dead-letters`` as a deferred
  record (``dlq.held.behind``, attempt 0), to wait behind the key's head in the scheduler.
- Which keys are blocked comes from the compacted ``retry-blocked-keys`` topic, read to its end
  on every assignment before any record is processed, then followed.
- A redelivery (from the retry topic) is processed whatever its key's state (it is the head);
  once the user's handler returns, its success is acknowledged on ``retry-acks``, and the
  scheduler releases the next record of the key.
- A record read again (its offset not committed when a consumer crashed or lost the partition)
  at or before its key's head on the head's partition is *in hand*: processed before its key
  was blocked, or its letter taken in already. It is skipped, neither processed nor deferred,
  so that it never reaches the handler behind later records of its key
  (:meth:`shared.ordered_retries.BlockedKeys.in_hand`).

:class:`OrderedRecords` is the bookkeeping, without Kafka; :class:`OrderedRetryConsumer` runs it
on the engine's plain clients. Offsets are committed after the letters and acknowledgements of
the records before them are acknowledged by the brokers (at least once), and never past a
record whose letter the scheduler has not taken in yet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from shared.dead_letters import ID, ORIGINAL_TOPIC, DeadLetter, dead_letter_for, header_items
from shared.engine.clients import (
    ISOLATION_LEVEL,
    KafkaTopicPartition,
    PlainConsumer,
    PlainProducer,
    client_kwargs,
    refresh_metadata,
)
from shared.ordered_retries import DEFERRED_ATTEMPT, HELD_BEHIND, LAST_TAKEN, BlockedKeys, head_position, header, lane_key
from shared.settings import Settings
from shared.topics import TopicNames, topic_names

log = logging.getLogger(__name__)

#: The error class of a deferred record's letter: it did not fail, it waits.
DEFERRED_ERROR_CLASS = "HeldBehind"
#: How long one fetch waits for records.
FETCH_TIMEOUT_MS = 500


class ConsumedRecord(Protocol):
    """What is read of a consumed record (aiokafka's ``ConsumerRecord`` has these)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A record to send: a dead letter or an acknowledgement."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


Handler = Callable[[ConsumedRecord], Awaitable[None]]


class OrderedRecords:
    """What to do with each record of an ordered topic and its retry topic, and what to send."""

    def __init__(self, topics: TopicNames, topic: str, retry_topic: str, blocked: BlockedKeys | None = None) -> None:
        self.topics = topics
        self.topic = topic
        self.retry_topic = retry_topic
        #: Per input partition, the offsets of records whose letters the scheduler has not taken
        #: in yet, with their lanes: their offsets are not committed, so that a consumer that
        #: starts after a crash reads them again and blocks their keys again, rather than
        #: overtaking a letter the blocked-keys topic does not show yet.
        self.letters_in_flight: dict[tuple[str, int], dict[int, bytes]] = {}
        self.blocked = blocked if blocked is not None else BlockedKeys()

    async def handle(self, record: ConsumedRecord, handler: Handler) -> Outgoing | None:
        """Process one record with ``handler``, defer it, or skip it (in hand already); what to
        send for it, if anything."""
        if self.in_hand(record):
            log.info(
                "record %s[%s]@%s skipped: read again, at or before its key's head", record.topic, record.partition, record.offset
            )
            return None
        if self.must_wait(record):
            return self.deferred(record)
        try:
            await handler(record)
        except Exception as exc:
            log.warning("record %s[%s]@%s failed: %s", record.topic, record.partition, record.offset, exc)
            return self.failed(record, exc)
        return self.acknowledgement(record)

    def lane_of(self, record: ConsumedRecord) -> bytes | None:
        """The record's lane; ``None`` for a record without a key (no order to keep)."""
        if record.key is None:
            return None
        origin = self.topic
        if record.topic == self.retry_topic:  # a redelivery: its lane is its original topic's
            original = header(header_items(record.headers), ORIGINAL_TOPIC)
            origin = original.decode() if original else self.topic
        return lane_key(origin, record.key)

    def blocked_keys_record(self, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]]) -> None:
        """A record of ``retry-blocked-keys`` (a tombstone frees its key)."""
        if key is None:
            return
        items = header_items(headers)
        last = header(items, LAST_TAKEN)
        self.blocked.apply(
            key, value.decode() if value is not None else None, last.decode() if last else None, head_position(items)
        )
        if key not in self.blocked.in_flight:  # every letter of the lane taken in: their records may be committed
            for offsets in self.letters_in_flight.values():
                for offset in [o for o, lane in offsets.items() if lane == key]:
                    del offsets[offset]

    def commit_offset(self, topic: str, partition: int, next_offset: int) -> int:
        """The offset to commit in an input partition read up to ``next_offset``: that of the first
        record whose letter is not taken in yet, if any."""
        offsets = self.letters_in_flight.get((topic, partition))
        return min(offsets, default=next_offset) if offsets else next_offset

    def in_hand(self, record: ConsumedRecord) -> bool:
        """A record of the topic read again, at or before its key's head on the head's partition:
        processed before its key was blocked, or its letter taken in already (a redelivery is
        never in hand: it is processed whatever its key's state)."""
        lane = self.lane_of(record)
        return (
            record.topic != self.retry_topic and lane is not None and self.blocked.in_hand(lane, record.partition, record.offset)
        )

    def must_wait(self, record: ConsumedRecord) -> bool:
        """A record of the topic whose key is blocked: deferred rather than processed. A
        redelivery never waits (it is its key's head)."""
        lane = self.lane_of(record)
        return record.topic != self.retry_topic and lane is not None and self.blocked.is_blocked(lane)

    def deferred(self, record: ConsumedRecord) -> Outgoing:
        """The dead letter of a record that waits behind its key's head; its key stays blocked."""
        lane = self.lane_of(record)
        head = self.blocked.head_of(lane) if lane is not None else None
        letter = self._dead_letter(record, RuntimeError(f"held behind {head}"))
        letter = replace(letter, attempt=DEFERRED_ATTEMPT, error_class=DEFERRED_ERROR_CLASS)
        return self._letter(lane, letter.id, [*letter.headers(), (HELD_BEHIND, (head or "").encode())], record)

    def failed(self, record: ConsumedRecord, error: BaseException) -> Outgoing:
        """The dead letter of a record the handler failed on (a redelivery's counts one more
        attempt and keeps its id); its key is blocked from now on."""
        letter = self._dead_letter(record, error)
        return self._letter(self.lane_of(record), letter.id, letter.headers(), record)

    def _dead_letter(self, record: ConsumedRecord, error: BaseException) -> DeadLetter:
        return dead_letter_for(
            record.key,
            record.value,
            header_items(record.headers),
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            error=error,
            retry_topic=self.retry_topic,
        )

    def _letter(self, lane: bytes | None, dlq_id: str, headers: list[tuple[str, bytes]], record: ConsumedRecord) -> Outgoing:
        if lane is not None:
            self.blocked.wrote(lane, dlq_id)
            self.letters_in_flight.setdefault((record.topic, record.partition), {})[record.offset] = lane
        return Outgoing(self.topics.dead_letters, record.key, record.value, headers)

    def acknowledgement(self, record: ConsumedRecord) -> Outgoing | None:
        """After the handler returned: a redelivery's acknowledgement, or ``None`` (not a redelivery)."""
        dlq_id = header(header_items(record.headers), ID)
        lane = self.lane_of(record)
        if record.topic != self.retry_topic or dlq_id is None or lane is None:
            return None
        return Outgoing(self.topics.retry_acks, lane, dlq_id, [])


class OrderedRetryConsumer:
    """Consume ``topic`` and ``retry_topic`` in ``group_id`` with ``handler``, keeping per-key order
    through failures (the scheduler must list ``topic`` in ``STATEFLEET_RETRY_ORDERED_TOPICS``)."""

    def __init__(self, settings: Settings, *, topic: str, retry_topic: str, group_id: str, handler: Handler) -> None:
        self.settings = settings
        self.topics = topic_names(settings)
        self.records = OrderedRecords(self.topics, topic, retry_topic)
        self.handler = handler
        self.group_id = group_id
        self._assignment: frozenset[Any] = frozenset()
        #: Per input partition, the offset after the last record handled, and the offset committed.
        self._read_up_to: dict[Any, int] = {}
        self._committed: dict[Any, int] = {}

    async def run(self, stop: asyncio.Event) -> None:
        # Read committed, as the engine's own consumers do: under exactly-once the scheduler writes
        # redeliveries and blocked keys in transactions, and an aborted one is written again.
        kwargs = client_kwargs(self.settings)
        consumer = PlainConsumer(
            self.records.topic,
            self.records.retry_topic,
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level=ISOLATION_LEVEL,
            **kwargs,
        )
        blocked = PlainConsumer(enable_auto_commit=False, isolation_level=ISOLATION_LEVEL, **kwargs)
        producer = PlainProducer(acks="all", enable_idempotence=True, **kwargs)
        await producer.start()
        await blocked.start()
        await consumer.start()
        try:
            await self._assign_blocked_keys(blocked)
            while not stop.is_set():
                fetched = await consumer.getmany(timeout_ms=FETCH_TIMEOUT_MS)
                assignment = frozenset(consumer.assignment())
                if assignment != self._assignment:  # read the blocked keys to their end before processing
                    self._assignment = assignment
                    await self._read_blocked_keys(blocked, to_end=True)
                else:
                    await self._read_blocked_keys(blocked, to_end=False)
                for tp, records in fetched.items():
                    for record in records:
                        await self._handle(producer, record)
                    self._read_up_to[tp] = records[-1].offset + 1
                await producer.flush()  # every letter and acknowledgement acknowledged before the commit
                await self._commit(consumer, assignment)
        finally:
            await consumer.stop()
            await blocked.stop()
            await producer.stop()

    async def _commit(self, consumer: Any, assignment: frozenset[Any]) -> None:
        """Commit what changed: records read, or letters the scheduler has taken in since."""
        offsets = {}
        for tp, next_offset in self._read_up_to.items():
            offset = self.records.commit_offset(tp.topic, tp.partition, next_offset)
            if tp in assignment and self._committed.get(tp) != offset:
                offsets[tp] = offset
        if offsets:
            await consumer.commit(offsets)
            self._committed.update(offsets)

    async def _handle(self, producer: Any, record: ConsumedRecord) -> None:
        out = await self.records.handle(record, self.handler)
        if out is not None:
            await producer.send(out.topic, out.value, key=out.key, headers=out.headers)

    async def _assign_blocked_keys(self, blocked: Any) -> None:
        await refresh_metadata(blocked)  # a topic created since the client started becomes known
        partitions = blocked.partitions_for_topic(self.topics.retry_blocked_keys)
        if not partitions:  # without it no key is ever known blocked: refuse rather than lose order
            raise RuntimeError(f"topic {self.topics.retry_blocked_keys!r} does not exist: start the retry scheduler first")
        tps = [KafkaTopicPartition(self.topics.retry_blocked_keys, p) for p in sorted(partitions)]
        blocked.assign(tps)
        await blocked.seek_to_beginning(*tps)

    async def _read_blocked_keys(self, blocked: Any, *, to_end: bool) -> None:
        """Apply what ``retry-blocked-keys`` says; with ``to_end``, up to its end offsets now."""
        tps = list(blocked.assignment())
        ends: dict[Any, int] = await blocked.end_offsets(tps) if to_end else {}
        while True:
            fetched = await blocked.getmany(timeout_ms=0 if not to_end else FETCH_TIMEOUT_MS)
            for records in fetched.values():
                for record in records:
                    self.records.blocked_keys_record(record.key, record.value, record.headers)
            if not to_end:
                return
            positions = {tp: await blocked.position(tp) for tp in ends}
            if all(positions[tp] >= end for tp, end in ends.items()):
                return
