"""The four tables the inbox handler writes (``schedule``, ``index``, ``expiry``, ``parked``;
see :mod:`services.retry_scheduler.state`) and the row changes every kind of inbox record
makes with them: look an id up, finish a scheduled entry (with a done marker and its
expiry), park an entry, and send what the handler puts out.

Every change is staged on the engine's input batch and committed by the engine
(changelog acknowledged, then RocksDB, with the inbox's next offset).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import orjson

from services.retry_scheduler.domain import MAX_DUE_MS
from services.retry_scheduler.entries import Decided, Entry, Replayed, decode_entry, decode_history, encode_entry, encode_history
from services.retry_scheduler.metrics import (
    DUPLICATES,
    LATENESS_SECONDS,
    ORIGIN_TOPICS,
    PARKED,
    REDELIVERED,
    REDELIVERY_FAILED,
    REFAILURES,
    SCHEDULED,
)
from services.retry_scheduler.state import (
    COUNTS_KEY,
    DONE_CANCELLED,
    DONE_KINDS,
    DONE_MEMORY_MS,
    DONE_UNPARKED,
    CountChange,
    Counts,
    Done,
    decode_index,
    due_key,
    encode_done,
    history_key,
    id_key,
)
from shared.engine import Engine, InputBatch, Outgoing, Table, partition_for
from shared.settings import Settings
from shared.topics import TopicNames

log = logging.getLogger(__name__)

#: Longest wait for one send to be accepted by the producer (topic metadata included).
SEND_TIMEOUT_S = 15.0
#: Under exactly_once, how long a redelivery's topic may take to show in the client's metadata
#: before that record counts as a failed send: the wait holds up the partition's batch, and an
#: existing topic shows in milliseconds.
TOPIC_LOOKUP_TIMEOUT_S = 3.0
#: Largest expiry row (a JSON list of ids), well below the broker's message size limit.
EXPIRY_BATCH_BYTES = 256 * 1024
#: Lateness samples kept for GET /retries/stats.
LATENESS_SAMPLES = 1000


def now_ms() -> int:
    return int(time.time() * 1000)


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


class InboxState:
    def __init__(self, engine: Engine, settings: Settings, topics: TopicNames) -> None:
        self.engine = engine
        self.settings = settings
        self.topics = topics
        self.schedule = engine.table("schedule")
        self.index = engine.table("index")
        self.expiry = engine.table("expiry")
        self.parked = engine.table("parked")
        self.counts = Counts()
        #: Per partition, its batch being staged (one at a time) and what it changes in the counts.
        self._count_changes: dict[int, tuple[InputBatch, CountChange]] = {}
        self.totals = {"redelivered": 0, "parked": 0, "scheduled": 0, "cancelled": 0}
        #: Per partition, a key no live entry sorts below; absent means "scan from the first key".
        self.low_water: dict[int, bytes] = {}
        #: Per partition, the earliest due time known of its entries (ms; absent: none known): its
        #: last tick's next due entry, or an entry scheduled since to come due before it.
        self.next_due: dict[int, int] = {}
        self.send_failures: dict[bytes, int] = {}
        self.lateness_ms: deque[int] = deque(maxlen=LATENESS_SAMPLES)
        #: Per partition, the expiry row the done markers of the record being handled go in.
        self._expiry_batch: dict[int, ExpiryBatch] = {}
        #: The policy's decision for an entry (the routing's), for a re-failure whose attempt
        #: is only known here; without it the route's decision stands.
        self.decide_fate: Callable[[Entry, int], Entry] | None = None

    def partition_of(self, dlq_id: str) -> int:
        return partition_for(dlq_id, self.settings.topic_partitions)

    @property
    def stores(self) -> list[Table]:
        return [self.index, self.schedule, self.expiry, self.parked]

    def index_state(self, batch: InputBatch, idk: bytes) -> tuple[bytes, bytes, Entry] | Done | None:
        """What the index says of an id in the batch's partition: scheduled (key, stored bytes,
        entry), a done marker, or nothing."""
        raw_index = batch.read(self.index, idk)
        if raw_index is None:
            return None
        state = decode_index(raw_index)
        if isinstance(state, Done):
            return state
        raw = batch.read(self.schedule, state)
        return (state, raw, decode_entry(raw)) if raw is not None else None

    @staticmethod
    def delete(batch: InputBatch, table: Table, key: bytes) -> bool:
        """Stage the delete of ``key`` (a tombstone in the changelog); False when there is no such row."""
        if batch.read(table, key) is None:
            return False
        batch.write(table, key, None)
        return True

    def carry_history(self, batch: InputBatch, dlq_id: str, stored: bytes) -> bytes:
        """``stored`` with the history its id kept while between attempts (and that row gone)."""
        hk = history_key(dlq_id)
        raw = batch.read(self.index, hk)
        if raw is None:
            return stored
        batch.write(self.index, hk, None)
        try:
            return encode_entry(decode_entry(stored).with_history(*decode_history(raw)))
        except ValueError as exc:
            log.warning("dropping the unreadable history of dlq.id=%s: %s", dlq_id, exc)
            return stored

    def keep_history(self, batch: InputBatch, entry: Entry) -> None:
        """Keep an entry's history while it is away (redelivered): its next attempt takes it back."""
        if entry.history:
            batch.write(self.index, history_key(entry.id), encode_history(entry.history))

    def count(self, batch: InputBatch, which: str, counted_as: tuple[str, str], n: int = 1) -> None:
        """Count ``n`` more (or fewer) ``which`` (scheduled, parked) entries under ``counted_as``
        (:attr:`Entry.counted_as`) in the batch's partition: its ``!counts`` row is written once
        with the batch's other rows, and the in-memory counts follow once it is committed."""
        self._staged_change(batch).add(which, counted_as, n)

    def _staged_change(self, batch: InputBatch) -> CountChange:
        """What the batch being staged changes in its partition's counts (written before its commit)."""
        staged = self._count_changes.get(batch.partition)
        if staged is None or staged[0] is not batch:  # not another batch's, whose handler failed
            staged = self._count_changes[batch.partition] = (batch, CountChange())
            batch.before_commit(lambda: self._write_counts(batch))
        return staged[1]

    def _write_counts(self, batch: InputBatch) -> None:
        partition = batch.partition
        _, change = self._count_changes.pop(partition)
        change.settle()
        batch.write(self.index, COUNTS_KEY, self.counts.row_with(partition, change))
        batch.after_commit(lambda: self._committed(partition, change))

    def _committed(self, partition: int, change: CountChange) -> None:
        self.counts.apply(partition, change)
        for topic, n in change.newly_scheduled_by_topic().items():
            SCHEDULED.labels(ORIGIN_TOPICS.label(topic, n)).inc(n)
            self.totals["scheduled"] += n

    def finish(self, batch: InputBatch, key: bytes, entry: Entry, done: bytes | None, *, read: bool = False) -> None:
        """Remove a scheduled entry (``read``: the batch has just read its row, so it is there).

        With ``done`` the index keeps a marker that this attempt was redelivered or
        cancelled, so a copy of its dead letter read later is dropped; without, the
        index row goes too (the id is about to be scheduled again or parked).
        """
        if read:
            batch.write(self.schedule, key, None)
            self.count(batch, "scheduled", entry.counted_as, -1)
        elif self.delete(batch, self.schedule, key):
            self.count(batch, "scheduled", entry.counted_as, -1)
        idk = id_key(entry.id)
        if done is not None:
            self.mark_done(batch, idk, entry.id, done, entry.attempt, entry.fingerprints)
            self.keep_history(batch, entry)
        elif batch.read(self.index, idk) == key:
            self.delete(batch, self.index, idk)
        self.send_failures.pop(key, None)

    def mark_done(
        self, batch: InputBatch, idk: bytes, dlq_id: str, kind: bytes, attempt: int, fingerprints: tuple[str, ...] = ()
    ) -> None:
        """Leave a done marker in the index; its expiry is written with the others of this record."""
        expiry = self._expiry_batch.get(batch.partition)
        if expiry is None:
            expire_at = min(now_ms() + DONE_MEMORY_MS, MAX_DUE_MS)
            expiry = self._expiry_batch[batch.partition] = ExpiryBatch(due_key(expire_at, f"~{uuid.uuid4().hex[:16]}"))
        batch.write(self.index, idk, encode_done(kind, attempt, expiry.key, fingerprints))
        expiry.ids.append(dlq_id)
        expiry.size += len(dlq_id) + 3
        if expiry.size >= EXPIRY_BATCH_BYTES:
            self.write_expiry(batch)

    def write_expiry(self, batch: InputBatch) -> None:
        """One expiry row for all the markers left while handling the current record."""
        expiry = self._expiry_batch.pop(batch.partition, None)
        if expiry is not None and expiry.ids:
            batch.write(self.expiry, expiry.key, orjson.dumps(expiry.ids))

    def dropped(self, letter: Decided, kind: str, reason: str) -> bool:
        """A dead letter not stored: counted under ``kind`` and logged with why."""
        DUPLICATES.labels(kind).inc()
        log.info("dropped a dead letter of dlq.id=%s attempt=%s: %s", letter.id, letter.attempt, reason)
        return False

    async def store_decided(self, batch: InputBatch, letter: Decided) -> bool:
        """Store a decided dead letter (schedule or park it), unless it is a copy of one already
        taken in; whether it was stored.

        The rule (``docs/dead-letter-protocol.md``, "Re-failures and duplicates"): a record whose
        fingerprint the id already knows is the same dead-letter record again, dropped. Otherwise,
        while the id is scheduled or parked (not redelivered since) a letter of that attempt or an
        earlier one is a copy, dropped, and a later attempt replaces it; once that attempt was
        redelivered (or replayed from the parking lot) any new record is a re-failure: it is
        stored as the next attempt, whatever attempt its producer wrote, so neither a producer
        that copies the headers it got nor one that sends none makes it vanish or loop.
        """
        dlq_id = letter.id
        idk = id_key(dlq_id)
        current = self.index_state(batch, idk)
        if isinstance(current, Done):
            entry = decode_entry(letter.stored)
            if set(entry.fingerprints) & set(current.fingerprints):
                return self.dropped(letter, DONE_KINDS[current.kind], f"the same dead-letter record again ({current.what})")
            if letter.attempt <= current.attempt:
                if current.kind == DONE_CANCELLED:
                    return self.dropped(letter, DONE_KINDS[current.kind], f"attempt {current.attempt} was cancelled")
                if letter.attempt == 0:  # a deferred record (ordered retries) has not failed: a copy
                    return self.dropped(letter, DONE_KINDS[current.kind], "a deferred record already taken in")
                # A re-failure of the attempt redelivered: the next attempt, with its own backoff.
                letter = self.refailure(entry, current.attempt + 1, letter.attempt)
            letter = self.with_known(letter, current.fingerprints)
        elif current is not None:
            current_key, _, current_entry = current
            if current_entry.attempt >= letter.attempt:
                self.remember(batch, self.schedule, current_key, current_entry, letter)
                kind = "stale" if current_entry.attempt > letter.attempt else "scheduled"
                return self.dropped(letter, kind, f"attempt {current_entry.attempt} is scheduled and not redelivered yet")
            self.finish(batch, current_key, current_entry, done=None)
            letter = self.with_known(letter, current_entry.fingerprints)
        if letter.parked:
            parked_raw = batch.read(self.parked, idk)
            parked_entry = decode_entry(parked_raw) if parked_raw is not None else None
            if parked_entry is not None and parked_entry.attempt >= letter.attempt:
                # The same attempt again (a dead letter written twice) is parked already: a second
                # record on the parking lot would be a repeat that exactly_once promises not to write.
                self.remember(batch, self.parked, idk, parked_entry, letter)
                kind = "parked" if parked_entry.attempt == letter.attempt else "stale"
                return self.dropped(letter, kind, f"attempt {parked_entry.attempt} is parked already")
        stored = letter.stored
        if isinstance(current, Done):  # back after a redelivery: it takes its history along
            stored = self.carry_history(batch, dlq_id, stored)
        if letter.parked:
            await self.park(batch, decode_entry(stored))
            return True
        self.schedule_at(batch, letter.due_at, dlq_id, stored, letter.counted_as)
        return True

    @staticmethod
    def remember(batch: InputBatch, table: Table, key: bytes, stored: Entry, copy: Decided) -> None:
        """Keep the fingerprint of a copy dropped while ``stored`` waits, so that the copy read
        again after the redelivery is still known as one."""
        merged = stored.with_fingerprints(decode_entry(copy.stored).fingerprints)
        if merged is not stored:
            batch.write(table, key, encode_entry(merged))

    def refailure(self, entry: Entry, attempt: int, written: int) -> Decided:
        """``entry`` as failed attempt ``attempt`` (its producer wrote ``written``), its fate decided again."""
        REFAILURES.labels("attempt-kept" if written == attempt - 1 else "attempt-lower").inc()
        log.info(
            "dlq.id=%s came back with attempt %s after attempt %s was redelivered: taken as attempt %s",
            entry.id,
            written,
            attempt - 1,
            attempt,
        )
        again = entry.refailed(attempt, max(entry.failed_at, entry.received_at))
        return Decided.of(self.decide_fate(again, now_ms()) if self.decide_fate is not None else again)

    @staticmethod
    def with_known(letter: Decided, fingerprints: tuple[str, ...]) -> Decided:
        """``letter`` remembering the fingerprints its id already had."""
        if not fingerprints:
            return letter
        entry = decode_entry(letter.stored)
        merged = entry.with_fingerprints(fingerprints)
        return letter if merged is entry else replace(letter, stored=encode_entry(merged))

    def schedule_at(self, batch: InputBatch, due_at: int, dlq_id: str, stored: bytes, counted_as: tuple[str, str]) -> None:
        """Write an entry to the schedule under its due time, and its id's index row."""
        partition = batch.partition
        key = due_key(due_at, dlq_id)
        batch.write(self.schedule, key, stored)
        batch.write(self.index, id_key(dlq_id), key)
        self._staged_change(batch).schedule(counted_as)
        low = self.low_water.get(partition)
        if low is not None and key < low:
            self.low_water[partition] = key
        known = self.next_due.get(partition)
        if known is None or due_at < known:
            self.next_due[partition] = due_at

    # -- parking ----------------------------------------------------------------------------------------

    async def park(self, batch: InputBatch, entry: Entry) -> None:
        """Publish to the parking lot and keep it in the parked table."""
        # A record needs a key or a value; a message that had neither is parked with an empty value.
        value = entry.value if entry.key is not None or entry.value is not None else b""
        [error] = await self.send_out(batch, [Outgoing(self.topics.parking_lot, entry.key, value, entry.parking_headers())])
        if error is not None:  # too large for the parking lot, say: it is still kept in the parked table
            log.error("could not publish dlq.id=%s to %s: %s", entry.id, self.topics.parking_lot, error)
        idk = id_key(entry.id)
        previous_raw = batch.read(self.parked, idk)
        if previous_raw is not None:
            self.count(batch, "parked", decode_entry(previous_raw).counted_as, -1)
        batch.write(self.parked, idk, encode_entry(entry))
        self.count(batch, "parked", entry.counted_as)
        PARKED.labels(ORIGIN_TOPICS.label(entry.origin_topic)).inc()
        self.totals["parked"] += 1
        log.info("parked dlq.id=%s attempt=%s from %s: %s", entry.id, entry.attempt, entry.origin_topic, entry.parked_reason)

    def unparked(self, batch: InputBatch, entry: Entry, action: str, actor: str | None = None) -> None:
        """A parked entry was redelivered: out of the parked table, with a done marker and its history kept."""
        idk = id_key(entry.id)
        if self.delete(batch, self.parked, idk):
            self.count(batch, "parked", entry.counted_as, -1)
        self.mark_done(batch, idk, entry.id, DONE_UNPARKED, entry.attempt, entry.fingerprints)
        self.keep_history(batch, entry.with_history(Replayed(now_ms(), action, entry.attempt, actor)))

    # -- what the handler puts out ----------------------------------------------------------------------

    async def send_out(self, batch: InputBatch, records: list[Outgoing]) -> list[str | None]:
        """Send what a handler puts out; per record ``None``, or why it could not go.

        At least once, the records are sent now (in record batches per partition) and their
        acknowledgements awaited (bounded): a failed send is its records' outcome, recorded or
        retried later, and the batch goes on. Exactly once, the records are staged on the batch and go out in its
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

    async def redeliver(self, batch: InputBatch, items: list[tuple[bytes, bytes]], trigger: str) -> list[Delivery]:
        """Send each entry to its retry topic (see :meth:`send_out`): a redelivery that fails
        or is not acknowledged in time keeps its entry for a later tick."""
        deliveries = [Delivery(key, decode_entry(raw)) for key, raw in items]
        errors = await self.send_out(
            batch, [Outgoing(d.entry.retry_topic, d.entry.key, d.entry.value, d.entry.headers) for d in deliveries]
        )
        sent_at = now_ms()
        for d, error in zip(deliveries, errors, strict=True):
            d.error = error
        # Counted per origin topic once for the batch (a tick redelivers thousands).
        redelivered: Counter[str] = Counter()
        for d in deliveries:
            if d.error is None:
                if trigger == "tick":  # lateness: how long after its due time a tick sent it
                    late = sent_at - d.entry.due_at
                    self.lateness_ms.append(late)
                    LATENESS_SECONDS.observe(max(late, 0) / 1000)
                redelivered[d.entry.origin_topic] += 1
            else:
                REDELIVERY_FAILED.inc()
                log.warning("redelivery of dlq.id=%s to %s failed: %s", d.entry.id, d.entry.retry_topic, d.error)
        for topic, n in redelivered.items():
            REDELIVERED.labels(trigger, ORIGIN_TOPICS.label(topic, n)).inc(n)
            self.totals["redelivered"] += n
        return deliveries
