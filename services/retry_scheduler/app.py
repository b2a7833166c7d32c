"""The retry scheduler service: its topology, batch handlers and the tick timer.

Two hops, so that everything about one ``dlq.id`` lives in one partition:

1. ``route`` reads ``dead-letters`` (anyone may write there, with any key and missing
   headers, on any number of partitions), reads the ``dlq.*`` headers with the
   contract's defaults, decides the message's fate (its due time, or the parking lot)
   and forwards the entry to store to the internal ``…-inbox`` topic keyed and
   partitioned by ``dlq.id``, already encoded, so the second hop stores it without
   decoding it. It keeps no state: the engine commits its input only after the
   forwarded records are acknowledged, and a record read twice is forwarded twice,
   which the second hop recognises by ``dlq.id`` and attempt.
2. ``process_inbox`` is the only handler that changes state. Per inbox partition it
   handles, in order: dead letters (schedule, or park when out of attempts), ticks
   (redeliver what is due), and replay / cancel / unpark commands sent by the HTTP API,
   for one message or for a group of parked ones.
   A table can only be changed from the handler that owns the partition, so ticks and
   commands travel through the same topic as the dead letters, and one partition's
   work is serialised. Its writes are staged on the batch and committed by the engine
   (changelog acknowledged, then RocksDB, with the inbox's next offset).

A timer sends a tick to every inbox partition this instance owns, every
``retry_tick_interval_s``. On a tick the handler seeks to the partition's low-water key,
reads only the entries due now (at most ``retry_batch_limit``), redelivers them with
key, value and headers kept, waits until the broker has acknowledged every one, and
only then stages their deletes from the schedule (tombstones in the changelog), leaving in the
index a done marker that drops copies of the same dead letter read again later. A crash
before the deletes redelivers them again after the restart, with the same ``dlq.id``
and ``dlq.attempt``; a crash before the acknowledgement loses nothing, because the
entry is still stored. Nothing is deleted that was not delivered.

Under ``exactly_once`` the redeliveries (and parking-lot records) are staged on the batch
instead and go out in the transaction that also deletes their entries and writes their
done markers: committed readers of a retry topic then see each attempt once, through
crashes, and an aborted batch neither redelivers nor forgets anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson

from services.retry_scheduler import DEFAULT_PORT, SERVICE
from services.retry_scheduler.domain import MAX_DUE_MS, Park, PolicyBook, build_policy_book, decide
from services.retry_scheduler.metrics import (
    CANCELLED,
    DUPLICATES,
    LATENESS_SECONDS,
    PARKED,
    REDELIVERED,
    REDELIVERY_FAILED,
    SCHEDULED,
    STORED,
    TICK_SECONDS,
)
from services.retry_scheduler.state import (
    DONE_CANCELLED,
    DONE_KINDS,
    DONE_MEMORY_MS,
    DONE_REDELIVERED,
    DONE_UNPARKED,
    Counts,
    Decided,
    Done,
    DueScan,
    Entry,
    GroupFilter,
    Replayed,
    decode_decided,
    decode_entry,
    decode_history,
    decode_index,
    due_key,
    due_prefix,
    encode_decided,
    encode_done,
    encode_entry,
    encode_history,
    entry_from_letter,
    first_due_key,
    history_key,
    id_key,
    id_of,
    iter_items,
    scan_due,
    scan_parked_matching,
)
from shared import dead_letters
from shared.engine import (
    Engine,
    InputBatch,
    Outgoing,
    Table,
    TopicSpec,
    active_partitions,
    app_id,
    changelog_topic_specs,
    partition_db,
    partition_for,
    recovery_done,
)
from shared.engine import Record as InRecord
from shared.settings import Settings
from shared.topics import TopicNames, topic_names

log = logging.getLogger(__name__)

# Kinds of inbox records: the first byte of the value.
KIND_DECIDED = b"D"  # a dead letter with its fate decided (state.encode_decided)
KIND_LETTER = b"L"  # a dead letter not yet decided (an entry as stored), as earlier versions wrote
KIND_TICK = b"T"
KIND_REPLAY = b"R"
KIND_CANCEL = b"C"
KIND_UNPARK = b"U"
COMMANDS = (KIND_REPLAY, KIND_CANCEL, KIND_UNPARK)
KIND_GROUP = b"G"  # replay or cancel the parked messages of a group in one partition

#: What a group command may do with the parked messages it covers.
GROUP_ACTIONS = ("replay", "cancel")
#: Most parked messages one group command acts on, and rows it examines, before it goes on
#: in a record of its own (so other work of the partition is not held up).
GROUP_CHUNK = 500
GROUP_SCAN_BUDGET = 20_000
# History actions (Replayed.action).
REPLAYED_NOW = "replay"
UNPARKED = "unpark"
GROUP_REPLAYED = "group replay"

#: Longest wait for one send to be accepted by the producer (topic metadata included).
SEND_TIMEOUT_S = 15.0
#: Consecutive failed redeliveries of one entry before it is parked instead.
MAX_SEND_FAILURES = 5
#: Under exactly_once, how long a redelivery's topic may take to show in the client's metadata
#: before that record counts as a failed send: the wait holds up the partition's batch, and an
#: existing topic shows in milliseconds.
TOPIC_LOOKUP_TIMEOUT_S = 3.0
#: Largest expiry row (a JSON list of ids), well below the broker's message size limit.
EXPIRY_BATCH_BYTES = 256 * 1024
#: Lateness samples kept for GET /retries/stats.
LATENESS_SAMPLES = 1000
#: Ticks that redelivered something, kept for GET /retries/stats.
BUSY_TICKS = 64


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class TickReport:
    partition: int
    at: int
    examined: int
    redelivered: int
    failed: int
    scan_seconds: float
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition, "at": self.at, "examined": self.examined,
            "redelivered": self.redelivered, "failed": self.failed,
            "scan_ms": round(self.scan_seconds * 1000, 3), "ms": round(self.seconds * 1000, 3),
        }


@dataclass
class ExpiryBatch:
    """Ids whose done markers expire together: one ``expiry`` row instead of one per id."""

    key: bytes
    ids: list[str] = field(default_factory=list)
    size: int = 0


@dataclass
class Delivery:
    key: bytes
    entry: Entry
    error: str | None = None


def next_low_water(start: bytes, now: int, scan: DueScan, failed_keys: list[bytes]) -> bytes:
    """After a tick: the key below which nothing is left (all delivered and deleted)."""
    if failed_keys:
        return min(failed_keys)
    if scan.more_due and scan.items:
        return scan.items[-1][0]
    return max(start, due_prefix(now + 1))


class RetrySchedulerService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topics: TopicNames = topic_names(settings)
        self.engine = engine = Engine(SERVICE, settings, DEFAULT_PORT)
        self.app = engine.app
        partitions = settings.topic_partitions
        self.inbox_topic_name = f"{app_id(SERVICE, settings)}-inbox"
        self.policies: PolicyBook = build_policy_book(
            max_attempts=settings.retry_max_attempts,
            base_delay_ms=settings.retry_base_delay_ms,
            max_delay_ms=settings.retry_max_delay_ms,
            jitter=settings.retry_jitter,
            overrides=settings.retry_policy_overrides,
            topic_prefix=settings.topic_prefix,
        )
        # Redelivering to these would feed the message straight back into the scheduler.
        self.looping_topics = frozenset({self.topics.dead_letters, self.inbox_topic_name})

        self.schedule_store = engine.table("schedule")
        self.index_store = engine.table("index")
        self.expiry_store = engine.table("expiry")
        self.parked_store = engine.table("parked")
        self.schedule = self.schedule_store.table
        self.index = self.index_store.table
        self.expiry = self.expiry_store.table
        self.parked = self.parked_store.table

        self.counts = Counts()
        #: Per partition, a key no live entry sorts below; absent means "scan from the first key".
        self.low_water: dict[int, bytes] = {}
        self.expiry_low_water: dict[int, bytes] = {}
        #: Per partition, when a tick was sent and not yet processed (monotonic seconds).
        self.tick_sent: dict[int, float] = {}
        self.send_failures: dict[bytes, int] = {}
        self.lateness_ms: deque[int] = deque(maxlen=LATENESS_SAMPLES)
        self.last_ticks: dict[int, TickReport] = {}
        self.busy_ticks: deque[TickReport] = deque(maxlen=BUSY_TICKS)
        #: Per partition, the expiry row the done markers of the record being handled go in.
        self._expiry_batch: dict[int, ExpiryBatch] = {}
        self.totals = {"redelivered": 0, "parked": 0, "scheduled": 0, "cancelled": 0}
        self.waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}

        engine.handler(self.topics.dead_letters, name="dead-letters", offsets=None)(self.route)
        # Every table the inbox handler writes keeps a copy of its next offsets, written with
        # the batch's rows; the input resumes from the smallest.
        engine.handler(
            self.inbox_topic_name, name="inbox", internal_partitions=partitions,
            offsets=[self.index_store, self.schedule_store, self.expiry_store, self.parked_store],
        )(self.process_inbox)
        engine.watch_trailing_holes()
        engine.timer(settings.retry_tick_interval_s, name="tick")(self.send_ticks)
        engine.on_recovered(self.schedule_store, self.on_recovered)

    def topic_specs(self) -> list[TopicSpec]:
        n = self.settings.topic_partitions
        return [
            TopicSpec(self.topics.dead_letters, n),
            TopicSpec(self.topics.retry, n),
            TopicSpec(self.topics.parking_lot, n),
            TopicSpec(self.inbox_topic_name, n),
            # Before the worker starts: a table written before Faust's own creation of its
            # changelog shows in the client's metadata fails with PartitionsMismatch.
            *changelog_topic_specs(self.app, self.settings),
        ]

    def partition_of(self, dlq_id: str) -> int:
        return partition_for(dlq_id, self.settings.topic_partitions)

    # -- hop 1: read dead letters, key them by dlq.id ---------------------------------------------

    async def route(self, batch: InputBatch) -> None:
        received_at = now_ms()
        for record in batch.records:
            try:
                raw_headers = dead_letters.header_items(record.headers)
                letter = dead_letters.parse_dead_letter(
                    record.key, record.value, raw_headers,
                    topic=record.topic, partition=record.partition, offset=record.offset,
                    timestamp_ms=record.timestamp or None, default_retry_topic=self.topics.retry,
                )
                entry = self.decide_fate(entry_from_letter(letter, raw_headers, received_at), received_at)
                encoded = KIND_DECIDED + encode_decided(Decided.of(entry))
            except Exception as exc:  # never expected: parsing is lenient; keep the message anyway
                log.exception("unreadable dead letter at %s[%s]@%s", record.topic, record.partition, record.offset)
                self._park_unreadable(batch, record, exc)
                continue
            batch.send(self.inbox_topic_name, letter.id.encode(), encoded, partition=self.partition_of(letter.id))

    def _park_unreadable(self, batch: InputBatch, record: InRecord, exc: Exception) -> None:
        """Publish a dead letter that cannot be read to the parking lot as it came, with the reason."""
        headers = [*dead_letters.header_items(record.headers), ("dlq.parked.reason", f"unreadable: {exc}"[:2000].encode())]
        value = record.value if record.key is not None or record.value is not None else b""
        batch.send(self.topics.parking_lot, record.key, value, headers=headers)
        PARKED.inc()

    def decide_fate(self, entry: Entry, now: int) -> Entry:
        """``entry`` scheduled for its next delivery, or parked when that cannot or must not be."""
        decision = decide(
            self.policies, dlq_id=entry.id, attempt=entry.attempt, origin_topic=entry.origin_topic,
            error_class=entry.error_class, failed_at=entry.failed_at, retry_topic=entry.retry_topic,
            now_ms=now, forbidden_retry_topics=self.looping_topics,
            has_key_or_value=entry.key is not None or entry.value is not None,
        )
        if isinstance(decision, Park):
            return entry.parked(now, decision.reason, decision.policy.max_attempts)
        return entry.scheduled(decision.due_at, decision.policy.max_attempts)

    # -- hop 2: the per-partition schedule ------------------------------------------------------------

    async def process_inbox(self, batch: InputBatch) -> None:
        for record in batch.records:
            value = record.value
            kind = value[:1] if isinstance(value, bytes) else b""
            try:
                if kind == KIND_DECIDED:
                    await self.ingest(batch, decode_decided(value[1:]))  # type: ignore[index]
                elif kind == KIND_LETTER:
                    await self.ingest(batch, Decided.of(self.decide_fate(decode_entry(value[1:]), now_ms())))  # type: ignore[index]
                elif kind == KIND_TICK:
                    await self.tick(batch)
                elif kind in COMMANDS:
                    await self.command(batch, kind, orjson.loads(value[1:]))  # type: ignore[index]
                elif kind == KIND_GROUP:
                    await self.group_command(batch, orjson.loads(value[1:]))  # type: ignore[index]
                else:
                    log.warning("ignoring inbox record of unknown kind %r at offset %s", kind, record.offset)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring malformed inbox record at %s[%s]@%s: %s",
                            record.topic, record.partition, record.offset, exc)

    async def ingest(self, batch: InputBatch, letter: Decided) -> None:
        """Store a decided dead letter, unless that attempt of its id is already stored or done."""
        partition = batch.partition
        dlq_id = letter.id
        idk = id_key(dlq_id)
        current = self._index_state(batch, idk)
        if isinstance(current, Done):
            if letter.attempt <= current.attempt:
                DUPLICATES.labels(DONE_KINDS[current.kind]).inc()  # that attempt is already done
                return
        elif current is not None:
            current_key, _, current_entry = current
            if current_entry.attempt > letter.attempt:
                DUPLICATES.labels("stale").inc()
                return
            if current_entry.attempt == letter.attempt:
                DUPLICATES.labels("scheduled").inc()  # the same dead letter again: already scheduled
                return
            self._finish(batch, current_key, current_entry, done=None)
        if letter.parked:
            parked_raw = batch.read(self.parked_store, idk)
            if parked_raw is not None and decode_entry(parked_raw).attempt > letter.attempt:
                DUPLICATES.labels("stale").inc()
                return
        stored = letter.stored
        if isinstance(current, Done):  # back after a redelivery: it takes its history along
            stored = self._carry_history(batch, dlq_id, stored)
        if letter.parked:
            await self._park(batch, decode_entry(stored))
            return
        key = due_key(letter.due_at, dlq_id)
        batch.write(self.schedule_store, key, stored)
        batch.write(self.index_store, idk, key)
        self.counts.add("scheduled", partition, letter.counted_as)
        low = self.low_water.get(partition)
        if low is not None and key < low:
            self.low_water[partition] = key
        SCHEDULED.inc()
        self.totals["scheduled"] += 1

    def _carry_history(self, batch: InputBatch, dlq_id: str, stored: bytes) -> bytes:
        """``stored`` with the history its id kept while between attempts (and that row gone)."""
        hk = history_key(dlq_id)
        raw = batch.read(self.index_store, hk)
        if raw is None:
            return stored
        batch.write(self.index_store, hk, None)
        try:
            return encode_entry(decode_entry(stored).with_history(*decode_history(raw)))
        except ValueError as exc:
            log.warning("dropping the unreadable history of dlq.id=%s: %s", dlq_id, exc)
            return stored

    def _keep_history(self, batch: InputBatch, entry: Entry) -> None:
        """Keep an entry's history while it is away (redelivered): its next attempt takes it back."""
        if entry.history:
            batch.write(self.index_store, history_key(entry.id), encode_history(entry.history))

    def _index_state(self, batch: InputBatch, idk: bytes) -> tuple[bytes, bytes, Entry] | Done | None:
        """What the index says of an id in the batch's partition: scheduled (key, stored bytes,
        entry), a done marker, or nothing."""
        raw_index = batch.read(self.index_store, idk)
        if raw_index is None:
            return None
        state = decode_index(raw_index)
        if isinstance(state, Done):
            return state
        raw = batch.read(self.schedule_store, state)
        return (state, raw, decode_entry(raw)) if raw is not None else None

    async def _park(self, batch: InputBatch, entry: Entry) -> None:
        """Publish to the parking lot and keep it in the parked table."""
        partition = batch.partition
        # A record needs a key or a value; a message that had neither is parked with an empty value.
        value = entry.value if entry.key is not None or entry.value is not None else b""
        [error] = await self._send_out(batch, [Outgoing(self.topics.parking_lot, entry.key, value, entry.parking_headers())])
        if error is not None:  # too large for the parking lot, say: it is still kept in the parked table
            log.error("could not publish dlq.id=%s to %s: %s", entry.id, self.topics.parking_lot, error)
        idk = id_key(entry.id)
        previous_raw = batch.read(self.parked_store, idk)
        if previous_raw is not None:
            self.counts.add("parked", partition, decode_entry(previous_raw).counted_as, -1)
        batch.write(self.parked_store, idk, encode_entry(entry))
        self.counts.add("parked", partition, entry.counted_as)
        PARKED.inc()
        self.totals["parked"] += 1
        log.info(
            "parked dlq.id=%s attempt=%s from %s: %s", entry.id, entry.attempt, entry.origin_topic, entry.parked_reason,
        )

    @staticmethod
    def _delete(batch: InputBatch, table: Table, key: bytes) -> bool:
        """Stage the delete of ``key`` (a tombstone in the changelog); False when there is no such row."""
        if batch.read(table, key) is None:
            return False
        batch.write(table, key, None)
        return True

    def _finish(self, batch: InputBatch, key: bytes, entry: Entry, done: bytes | None) -> None:
        """Remove a scheduled entry.

        With ``done`` the index keeps a marker that this attempt was redelivered or
        cancelled, so a copy of its dead letter read later is dropped; without, the
        index row goes too (the id is about to be scheduled again or parked).
        """
        if self._delete(batch, self.schedule_store, key):
            self.counts.add("scheduled", batch.partition, entry.counted_as, -1)
        idk = id_key(entry.id)
        if done is not None:
            self._mark_done(batch, idk, entry.id, done, entry.attempt)
            self._keep_history(batch, entry)
        elif batch.read(self.index_store, idk) == key:
            self._delete(batch, self.index_store, idk)
        self.send_failures.pop(key, None)

    def _mark_done(self, batch: InputBatch, idk: bytes, dlq_id: str, kind: bytes, attempt: int) -> None:
        """Leave a done marker in the index; its expiry is written with the others of this record."""
        expiry = self._expiry_batch.get(batch.partition)
        if expiry is None:
            expire_at = min(now_ms() + DONE_MEMORY_MS, MAX_DUE_MS)
            expiry = self._expiry_batch[batch.partition] = ExpiryBatch(due_key(expire_at, f"~{uuid.uuid4().hex[:16]}"))
        batch.write(self.index_store, idk, encode_done(kind, attempt, expiry.key))
        expiry.ids.append(dlq_id)
        expiry.size += len(dlq_id) + 3
        if expiry.size >= EXPIRY_BATCH_BYTES:
            self._write_expiry(batch)

    def _write_expiry(self, batch: InputBatch) -> None:
        """One expiry row for all the markers left while handling the current record."""
        expiry = self._expiry_batch.pop(batch.partition, None)
        if expiry is not None and expiry.ids:
            batch.write(self.expiry_store, expiry.key, orjson.dumps(expiry.ids))

    # -- ticks -------------------------------------------------------------------------------------------

    async def send_ticks(self) -> None:
        """Ask the handler to redeliver what is due, in every partition this instance owns."""
        if not recovery_done(self.app):
            return
        interval = self.settings.retry_tick_interval_s
        now = time.monotonic()
        for partition in sorted(active_partitions(self.app, self.schedule)):
            sent = self.tick_sent.get(partition)
            if sent is not None and now - sent < max(10 * interval, 5.0):
                continue  # the last tick is still queued: do not pile up more
            await self._send_tick(partition)

    async def _send_tick(self, partition: int) -> None:
        self.tick_sent[partition] = time.monotonic()
        try:
            await self.engine.send(self.inbox_topic_name, None, KIND_TICK, partition=partition)
        except Exception as exc:  # the broker away, say: the next interval sends it again
            # An exception out of a timer crashes the worker; a missed tick only delays the
            # redeliveries by one interval.
            self.tick_sent.pop(partition, None)
            log.warning("could not send the tick of inbox partition %d (sent again in %.1fs): %s: %s",
                        partition, self.settings.retry_tick_interval_s, type(exc).__name__, exc)

    async def tick(self, batch: InputBatch) -> None:
        partition = batch.partition
        self.tick_sent.pop(partition, None)
        started = time.perf_counter()
        now = now_ms()
        limit = self.settings.retry_batch_limit
        start = self.low_water.get(partition, b"")
        scan: DueScan = scan_due(batch.view(self.schedule_store), now, limit, start)
        scanned = time.perf_counter()
        deliveries = await self._redeliver(batch, scan.items, trigger="tick")
        failed_keys: list[bytes] = []
        for d in deliveries:
            if d.error is None:
                self._finish(batch, d.key, d.entry, done=DONE_REDELIVERED)
                continue
            failures = self.send_failures.get(d.key, 0) + 1
            self.send_failures[d.key] = failures
            if failures >= MAX_SEND_FAILURES:
                self._finish(batch, d.key, d.entry, done=None)
                reason = f"redelivery to {d.entry.retry_topic!r} failed {failures} times: {d.error}"
                await self._park(batch, d.entry.parked(now_ms(), reason, d.entry.max_attempts))
            else:
                failed_keys.append(d.key)
        self._write_expiry(batch)
        expired = self._expire_done_markers(batch, now, limit)
        self.low_water[partition] = next_low_water(start, now, scan, failed_keys)
        seconds = time.perf_counter() - started
        report = TickReport(
            partition=partition, at=now, examined=scan.examined,
            redelivered=sum(1 for d in deliveries if d.error is None), failed=len(failed_keys),
            scan_seconds=scanned - started, seconds=seconds,
        )
        self.last_ticks[partition] = report
        if report.redelivered or report.failed:
            self.busy_ticks.append(report)
        TICK_SECONDS.observe(seconds)
        if scan.more_due or expired.more_due:
            # A backlog: go on at once rather than a tick later (after this batch's commit).
            batch.send(self.inbox_topic_name, None, KIND_TICK, partition=partition)
            self.tick_sent[partition] = time.monotonic()

    def _expire_done_markers(self, batch: InputBatch, now: int, limit: int) -> DueScan:
        """Forget the done markers whose time has come."""
        partition = batch.partition
        start = self.expiry_low_water.get(partition, b"")
        scan = scan_due(batch.view(self.expiry_store), now, limit, start)
        for key, raw in scan.items:
            try:
                ids = orjson.loads(raw)
            except orjson.JSONDecodeError:
                ids = []
            for dlq_id in ids if isinstance(ids, list) else []:
                idk = id_key(str(dlq_id))
                raw_index = batch.read(self.index_store, idk)
                state = decode_index(raw_index) if raw_index is not None else None
                if isinstance(state, Done) and state.expiry_key == key:
                    self._delete(batch, self.index_store, idk)
                    self._delete(batch, self.index_store, history_key(str(dlq_id)))
            self._delete(batch, self.expiry_store, key)
        self.expiry_low_water[partition] = next_low_water(start, now, scan, [])
        return scan

    async def _send_out(self, batch: InputBatch, records: list[Outgoing]) -> list[str | None]:
        """Send what a handler puts out; per record ``None``, or why it could not go.

        At least once, each record is sent on its own now and its acknowledgement awaited
        (bounded): a failed send is that record's outcome, recorded or retried later, and the
        batch goes on. Exactly once, the records are staged on the batch and go out in its
        transaction with the state changes they stand for, so a crash repeats neither; a record
        that could never be sent (no such topic, too large) would abort every retry of the
        batch, so it is found first and left out with its reason."""
        if not self.engine.transactional:
            return await self.engine.deliver_each(records, SEND_TIMEOUT_S)
        errors = await self.engine.unsendable(records, TOPIC_LOOKUP_TIMEOUT_S)
        for record, error in zip(records, errors, strict=True):
            if error is None:
                batch.send(record.topic, record.key, record.value, headers=record.headers)
        return errors

    async def _redeliver(self, batch: InputBatch, items: list[tuple[bytes, bytes]], trigger: str) -> list[Delivery]:
        """Send each entry to its retry topic (see :meth:`_send_out`): a redelivery that fails
        or is not acknowledged in time keeps its entry for a later tick."""
        deliveries = [Delivery(key, decode_entry(raw)) for key, raw in items]
        errors = await self._send_out(
            batch, [Outgoing(d.entry.retry_topic, d.entry.key, d.entry.value, list(d.entry.headers)) for d in deliveries],
        )
        sent_at = now_ms()
        for d, error in zip(deliveries, errors, strict=True):
            d.error = error
        for d in deliveries:
            if d.error is None:
                if trigger == "tick":  # lateness: how long after its due time a tick sent it
                    late = sent_at - d.entry.due_at
                    self.lateness_ms.append(late)
                    LATENESS_SECONDS.observe(max(late, 0) / 1000)
                REDELIVERED.labels(trigger).inc()
                self.totals["redelivered"] += 1
            else:
                REDELIVERY_FAILED.inc()
                log.warning("redelivery of dlq.id=%s to %s failed: %s", d.entry.id, d.entry.retry_topic, d.error)
        return deliveries

    # -- commands from the HTTP API ------------------------------------------------------------------

    async def command(self, batch: InputBatch, kind: bytes, body: dict[str, Any]) -> None:
        dlq_id = body["id"]
        if not isinstance(dlq_id, str):
            raise ValueError("command without a string id")
        idk = id_key(dlq_id)
        result: dict[str, Any] = {"id": dlq_id, "status": "not_found"}
        if kind in (KIND_REPLAY, KIND_CANCEL):
            current = self._index_state(batch, idk)
            if current is not None and not isinstance(current, Done):
                key, raw, entry = current
                if kind == KIND_CANCEL:
                    self._finish(batch, key, entry, done=DONE_CANCELLED)
                    self._write_expiry(batch)
                    CANCELLED.inc()
                    self.totals["cancelled"] += 1
                    log.info("cancelled dlq.id=%s attempt=%s", dlq_id, entry.attempt)
                    result = {"id": dlq_id, "status": "cancelled", "attempt": entry.attempt}
                else:
                    [d] = await self._redeliver(batch, [(key, raw)], trigger="replay")
                    if d.error is None:
                        replayed = entry.with_history(Replayed(now_ms(), REPLAYED_NOW, entry.attempt))
                        self._finish(batch, key, replayed, done=DONE_REDELIVERED)
                        self._write_expiry(batch)
                        result = {
                            "id": dlq_id, "status": "redelivered", "attempt": entry.attempt,
                            "topic": entry.retry_topic,
                        }
                    else:
                        result = {"id": dlq_id, "status": "failed", "detail": d.error}
        elif kind == KIND_UNPARK:
            parked_raw = batch.read(self.parked_store, idk)
            if parked_raw is not None:
                entry = decode_entry(parked_raw)
                [d] = await self._redeliver(batch, [(idk, parked_raw)], trigger="unpark")
                if d.error is None:
                    self._unparked(batch, entry, UNPARKED)
                    self._write_expiry(batch)
                    log.info("replayed parked dlq.id=%s attempt=%s", dlq_id, entry.attempt)
                    result = {
                        "id": dlq_id, "status": "redelivered", "attempt": entry.attempt,
                        "topic": entry.retry_topic,
                    }
                else:
                    result = {"id": dlq_id, "status": "failed", "detail": d.error}
        waiter = self.waiters.get(str(body.get("req", "")))

        def answer() -> None:  # once the command's changes are committed
            if waiter is not None and not waiter.done():
                waiter.set_result(result)

        batch.after_commit(answer)

    def _unparked(self, batch: InputBatch, entry: Entry, action: str) -> None:
        """A parked entry was redelivered: out of the parked table, with a done marker and its history kept."""
        idk = id_key(entry.id)
        if self._delete(batch, self.parked_store, idk):
            self.counts.add("parked", batch.partition, entry.counted_as, -1)
        self._mark_done(batch, idk, entry.id, DONE_UNPARKED, entry.attempt)
        self._keep_history(batch, entry.with_history(Replayed(now_ms(), action, entry.attempt)))

    async def group_command(self, batch: InputBatch, body: dict[str, Any]) -> None:
        """Replay or cancel the parked messages of this partition that a group filter covers.

        Acts on at most :data:`GROUP_CHUNK` of them per record; the rest follow in a record
        this one sends to the same partition, committed with this batch. The answer (to the
        waiting HTTP request, if any) is this first record's outcome, with ``more`` set when
        the work goes on.
        """
        action = body["action"]
        if action not in GROUP_ACTIONS:
            raise ValueError(f"unknown group action {action!r}")
        flt = GroupFilter.from_json(body["filter"])
        after = body.get("after")
        found, resume = scan_parked_matching(
            batch.view(self.parked_store), flt, after=id_key(after) if isinstance(after, str) else None,
            limit=GROUP_CHUNK, budget=GROUP_SCAN_BUDGET,
        )
        done = failed = 0
        if action == "cancel":
            for key, raw, _ in found:
                entry = decode_entry(raw)
                if self._delete(batch, self.parked_store, key):
                    self.counts.add("parked", batch.partition, entry.counted_as, -1)
                self._mark_done(batch, key, entry.id, DONE_CANCELLED, entry.attempt)
                CANCELLED.inc()
                self.totals["cancelled"] += 1
                done += 1
        elif found:
            items = [(key, raw) for key, raw, _ in found]
            for d in await self._redeliver(batch, items, trigger="group-replay"):
                if d.error is None:
                    self._unparked(batch, d.entry, GROUP_REPLAYED)
                    done += 1
                else:
                    failed += 1  # stays parked
        self._write_expiry(batch)
        if resume is not None:
            follow = {"action": action, "filter": flt.to_json(), "after": id_of(resume)}
            batch.send(self.inbox_topic_name, None, KIND_GROUP + orjson.dumps(follow), partition=batch.partition)
        log.info("group %s of parked %s in partition %s: %d done, %d failed%s", action, flt, batch.partition,
                 done, failed, ", more to follow" if resume is not None else "")
        result = {"partition": batch.partition, "status": "done", "matched": len(found), "done": done,
                  "failed": failed, "more": resume is not None}
        waiter = self.waiters.get(str(body.get("req", "")))

        def answer() -> None:
            if waiter is not None and not waiter.done():
                waiter.set_result(result)

        batch.after_commit(answer)

    async def request_group(self, partition: int, action: str, flt: GroupFilter, timeout_s: float) -> dict[str, Any]:
        """Send a group command to ``partition`` and wait for the handler's answer (as :meth:`request`)."""
        req = uuid.uuid4().hex
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiters[req] = waiter
        try:
            body = {"action": action, "filter": flt.to_json(), "req": req}
            await self.engine.send(self.inbox_topic_name, None, KIND_GROUP + orjson.dumps(body), partition=partition)
            return await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except TimeoutError:
            return {"partition": partition, "status": "accepted"}
        finally:
            self.waiters.pop(req, None)

    async def request(self, kind: bytes, dlq_id: str, timeout_s: float) -> dict[str, Any]:
        """Send a command to the partition of ``dlq_id`` and wait for the handler's answer.

        ``{"status": "accepted"}`` when the answer does not come within ``timeout_s`` (the
        partition moved meanwhile): the command is still applied, by the new owner.
        """
        req = uuid.uuid4().hex
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiters[req] = waiter
        try:
            await self.engine.send(
                self.inbox_topic_name, dlq_id.encode(), kind + orjson.dumps({"id": dlq_id, "req": req}),
                partition=self.partition_of(dlq_id),
            )
            return await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except TimeoutError:
            return {"id": dlq_id, "status": "accepted"}
        finally:
            self.waiters.pop(req, None)

    # -- recovery and reads ---------------------------------------------------------------------------

    async def on_recovered(self) -> None:
        started = time.perf_counter()
        owned = active_partitions(self.app, self.schedule)
        self.low_water = {}
        self.expiry_low_water = {}
        self.tick_sent = {}
        self.send_failures = {}
        rows = self.counts.rebuild(
            {p: iter_items(partition_db(self.schedule, p)) for p in owned},
            {p: iter_items(partition_db(self.parked, p)) for p in owned},
        )
        self.update_gauges()
        log.info(
            "recovered %d scheduled and parked messages in %d partitions (%.2fs)",
            rows, len(owned), time.perf_counter() - started,
        )

    def owned(self) -> set[int]:
        return active_partitions(self.app, self.schedule)

    def update_gauges(self) -> None:
        totals = self.counts.totals(self.owned())
        STORED.labels("schedule").set(totals["scheduled"])
        STORED.labels("parked").set(totals["parked"])

    def index_entry(self, dlq_id: str) -> Entry | Done | None:
        """For HTTP reads: the scheduled entry of an id, its done marker, or nothing."""
        partition = self.partition_of(dlq_id)
        raw_index = partition_db(self.index, partition).get(id_key(dlq_id))
        if raw_index is None:
            return None
        state = decode_index(bytes(raw_index))
        if isinstance(state, Done):
            return state
        raw = partition_db(self.schedule, partition).get(state)
        return decode_entry(bytes(raw)) if raw is not None else None

    def scheduled_entry(self, dlq_id: str) -> Entry | None:
        state = self.index_entry(dlq_id)
        return state if isinstance(state, Entry) else None

    def parked_entry(self, dlq_id: str) -> Entry | None:
        raw = partition_db(self.parked, self.partition_of(dlq_id)).get(id_key(dlq_id))
        return decode_entry(bytes(raw)) if raw is not None else None

    def oldest_due(self, partitions: set[int]) -> int | None:
        oldest: int | None = None
        for p in partitions:
            key = first_due_key(partition_db(self.schedule, p), self.low_water.get(p, b""))
            if key is not None:
                due = int.from_bytes(key[:8], "big")
                oldest = due if oldest is None else min(oldest, due)
        return oldest
