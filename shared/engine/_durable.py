"""Exactly the input, in order, and state that is in the changelog before anything depends on it.

Two things a handler that keeps state cannot leave to Faust's at-least-once processing:

**Every input offset, in order.** Around start-up and rebalances Faust's consumer can
skip records: it fetches while table recovery runs, discards what it fetched, seeks
back to the committed offsets, and then drops re-fetched records below the offset it
had already read (observed as a batch ending at offset 220 followed by one starting at
235). So each handler keeps, per input partition, the next offset it expects, in the
table(s) it writes and written with the batch's state. :class:`OrderedInput` compares
each batch with it: records below it are replays and are dropped; a hole above it is
read back from Kafka with a plain consumer (:class:`Backfill`) and processed first.
A hole is seen when the record after it arrives; records skipped at the very end of a
partition, with nothing after them, are found by :mod:`shared.engine._trailing_holes`, which
sends the consumer back to them.
The rows live in partition ``p`` of the table for input partition ``p``, which relies on
Faust assigning the same partition number of co-partitioned topics (same partition
count) and tables to the same instance.

**State durable before it is relied on.** A Faust table write puts the row into the
local RocksDB at once and queues its changelog record in the producer's buffer;
``producer.flush()`` is what offset commits rely on, and it can return with records
still queued (it gives up after 100 ms without progress). An instance that then
restores from the changelog would get an older row than the input already committed
(or the output already sent) implies. So tables are written through
:class:`DurableTable`, committed by :func:`shared.engine._batch.write_all`:

1. the changelog records are sent and each acknowledgement is awaited;
2. then the rows go into the local RocksDB partition;
3. then the partition's persisted changelog offset is advanced (where Faust resumes
   restoring from at start-up).

A crash between 1 and 2 leaves the local row behind the changelog, and the restart
replays the changelog from before it (3 had not happened). (When two handlers write one
table, the later write can be applied first; a crash then can leave the earlier write
acknowledged but neither local nor replayed. It is lost whole, its next-offset rows with
it, so its handler reads that input again.) The next-offset rows are
written last in each batch, after the state rows of the same changelog partition, so
they are never ahead of the state either. A handler whose state is spread over several
tables keeps a copy of its next-offset rows in each (:meth:`OrderedInput.writes`) and
resumes from the smallest: a crash that left one table's rows in its changelog and not
another's makes the handler read the difference again, so its processing must be
idempotent for those records.

Tables written this way are raw-bytes tables (``key_type=bytes, value_type=bytes``)
that the handler writes only through this module, never with ``table[key] = value``.
Their keys must not start with :data:`NEXT_OFFSET_PREFIX`.

**Where the rows live.** Each partition of a table is one RocksDB database with two column
families (:mod:`shared.engine._rocksdb`): the default family holds the service's rows and
nothing else; the engine family (``statefleet-engine``) holds the engine's own rows, the
next-offset rows and Faust's persisted changelog offset. In the changelog the next-offset rows
are records of the table like the service's (under their prefixed keys), so they move with
the state: every path that applies changelog records locally (the commit below, Faust's
recovery and standbys, the bulk restore of :mod:`shared.engine._restore`) sends a key with
:data:`NEXT_OFFSET_PREFIX` to the engine family, a tombstone of one deleting it there. The
commit's steps 2 and 3 are one write batch across both families. So a service's reads
(:meth:`~DurableTable.items`, :meth:`~DurableTable.view`, a batch's views) see its own rows
only, with no filtering, and the next offsets are read from the engine family
(:meth:`~TableOffsets.get` of a next-offset key). A partition database of an earlier
version, with the engine rows in its default family, has them moved when it is opened.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition

from shared.engine._assignor import active_partitions, all_owner_urls, partition_owner_url
from shared.engine._clients import ISOLATION_LEVEL, client_kwargs, started_when_reachable
from shared.engine._copies import Copy, local_copy
from shared.engine._faust import AnyTable, partition_db, partition_items
from shared.engine._rocksdb import NEXT_OFFSET_PREFIX as NEXT_OFFSET_PREFIX  # re-exported
from shared.engine._rocksdb import PartitionWrite, family_for, persisted_offset
from shared.metrics import LOCAL_STATE_DISCARDED
from shared.settings import Settings

log = logging.getLogger(__name__)

#: (partition, key) -> value; ``None`` deletes the row (a tombstone in the changelog)
Rows = Mapping[tuple[int, bytes], bytes | None]

#: How long a wait for acknowledgements goes before it is logged (and then again as often).
SLOW_ACK_WARNING_S = 30.0


def next_offset_key(topic: str) -> bytes:
    return NEXT_OFFSET_PREFIX + topic.encode()


def input_id_key(topic: str) -> bytes:
    """The row beside an input's next offsets naming the incarnation (topic id) of the input they
    count: an engine row that travels in the changelog with them. A topic name holds no NUL, so
    no next-offset key is ever this one."""
    return NEXT_OFFSET_PREFIX + b"\x00input-id\x00" + topic.encode()


def state_items(
    table: AnyTable, partition: int, from_key: bytes | None = None, backwards: bool = False
) -> Iterator[tuple[bytes, bytes]]:
    """A partition's rows in key order (or reverse), from ``from_key``: its default column
    family, which holds the service's rows only."""
    return partition_items(table, partition, from_key, backwards)


class RowIterator(Protocol):
    """rocksdict's raw iterator, as the views below give it."""

    def seek(self, key: bytes) -> None: ...
    def valid(self) -> bool: ...
    def key(self) -> Any: ...
    def value(self) -> Any: ...
    def next(self) -> None: ...


class OrderedRows(Protocol):
    """A table partition in key order without the engine's rows: :meth:`DurableTable.view`, or
    a batch's view of it with the batch's staged rows over it (``InputBatch.view``)."""

    def get(self, key: bytes) -> bytes | None: ...
    def iter(self) -> RowIterator: ...


class SortedView:
    """One partition of a table, read-only and in key order, without the engine's rows (see
    :meth:`DurableTable.view`)."""

    def __init__(self, db: Any) -> None:
        self._db = db

    def get(self, key: bytes) -> bytes | None:
        raw: bytes | None = self._db.get(key)
        return raw

    def iter(self) -> RowIterator:
        it: RowIterator = self._db.iter()
        return it


@dataclass(slots=True)
class InRecord:
    """One input record, from the Faust stream or read back from Kafka."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp: int | None = None  # epoch ms, as Kafka keeps it

    @property
    def message(self) -> InRecord:
        """So a record can stand in for a Faust event (``event.message``), e.g. for dead letters."""
        return self


class OffsetStore(Protocol):
    """Where :class:`OrderedInput` reads next offsets from (a :class:`DurableTable`)."""

    def get(self, partition: int, key: bytes) -> bytes | None: ...


def offsets_optional(store: OffsetStore) -> bool:
    """Whether ``store`` was added to a handler that already ran (see :meth:`Engine.table`): a
    partition where it holds no next offset yet resumes from the handler's other tables."""
    return bool(getattr(store, "added_later", False))


class TableOffsets:
    """Reads of a table's partitions, as an :class:`OffsetStore` (the read side of
    :class:`DurableTable`)."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def get(self, partition: int, key: bytes) -> bytes | None:
        """The row of ``key``: from the engine family for a next-offset key, else from the
        service's rows."""
        raw: bytes | None = family_for(partition_db(self.table, partition), key).get(key)
        return raw

    def db(self, partition: int) -> Any:
        """The partition's RocksDB database, its default family (the service's rows; valid until
        the next rebalance)."""
        return partition_db(self.table, partition)


class DurableTable(TableOffsets):
    """Write-through access to a raw-bytes Faust table (``key_type=bytes, value_type=bytes``).

    It is the one table object services and ``shared.http`` hold: the reads below give them
    what they need of the Faust table (ordered scans, ownership, copies) without it, and
    without the engine's own rows."""

    def __init__(self, app: faust.App, table: Any, *, added_later: bool = False) -> None:
        super().__init__(table)
        self.app = app
        self.changelog = table.changelog_topic.get_topic_name()
        #: Added to a handler that ran before it existed: see :func:`offsets_optional`.
        self.added_later = added_later

    @property
    def name(self) -> str:
        """The table's name, as declared with ``Engine.table``."""
        return str(self.table.name)

    @property
    def partitions(self) -> int:
        """How many partitions the table (and its changelog) has."""
        return int(self.table.partitions)

    def items(self, partition: int, from_key: bytes | None = None, backwards: bool = False) -> Iterator[tuple[bytes, bytes]]:
        """The service's rows of ``partition`` in key order (``backwards``: in reverse), from
        ``from_key`` on. Valid until the next rebalance, like the database it reads."""
        return state_items(self.table, partition, from_key, backwards)

    def view(self, partition: int) -> SortedView:
        """``partition`` for ordered scans that seek (``iter()``, as rocksdict's raw iterator),
        without the engine's rows. Valid until the next rebalance, like the database it reads."""
        return SortedView(partition_db(self.table, partition))

    def owned_partitions(self) -> set[int]:
        """The partitions of this table this instance currently owns as active (processes the
        input of)."""
        return active_partitions(self.app, self.table)

    def owner_url(self, partition: int) -> str | None:
        """The URL of the instance that owns ``partition`` as active, if known (where its reads
        and changes are forwarded)."""
        return partition_owner_url(self.app, self.table, partition)

    def owner_urls(self) -> set[str]:
        """The URL of every instance that owns at least one partition of this table as active."""
        return all_owner_urls(self.app, self.table)

    def applied_offset(self, partition: int) -> int | None:
        """The last changelog offset this instance's copy of ``partition`` has applied (None: none
        yet): it moves with every write of this instance and every record restored or read as a
        standby, so a copy whose offset did not move holds the same rows."""
        return persisted_offset(partition_db(self.table, partition))

    async def copy(self, partition: int) -> Copy | None:
        """This instance's copy of ``partition`` and how far behind its changelog it is, or
        None when it holds none (what a read from a copy answers with)."""
        return await local_copy(self.app, self.table, partition, exact=True)

    def apply_rows(self, rows: Rows, offsets: Mapping[int, int]) -> None:
        """Rows and the changelog offset they bring a partition to, in one RocksDB write batch per
        partition (across its column families: next-offset rows and the offset into the engine
        family, the service's rows into the default one): a crash leaves a partition with all of
        them or none."""
        writes: dict[int, PartitionWrite] = {}

        def write_for(partition: int) -> PartitionWrite:
            write = writes.get(partition)
            if write is None:
                write = writes[partition] = PartitionWrite(partition_db(self.table, partition))
            return write

        for (partition, key), value in rows.items():
            write_for(partition).apply(key, value)
        for partition, offset in offsets.items():
            write_for(partition).set_persisted_offset(offset)
        for write in writes.values():
            write.write()


async def acknowledged(aws: Sequence[Awaitable[Any]], what: str, warn_every_s: float = SLOW_ACK_WARNING_S) -> list[Any]:
    """Every result of ``aws`` in order (the first error raises), with a warning logged each
    ``warn_every_s`` while any is outstanding: a producer that stopped delivering shows
    otherwise only as a handler that stopped processing, for as long as Faust's request
    timeout (20 minutes)."""
    gathered = asyncio.gather(*aws)
    started = time.monotonic()
    try:
        while True:
            done, _ = await asyncio.wait({gathered}, timeout=warn_every_s)
            if done:
                return list(gathered.result())
            log.warning("%s: still not acknowledged by the broker after %.0fs", what, time.monotonic() - started)
    except asyncio.CancelledError:
        gathered.cancel()
        raise


class Backfill:
    """Reads ranges of a partition back from Kafka with one plain consumer (no group)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._consumer: AIOKafkaConsumer | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Connect now (the first metadata fetch of a large cluster takes a while) rather than
        at the first read-back."""
        async with self._lock:
            await self._client()

    async def _client(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            self._consumer = await started_when_reachable(
                lambda: AIOKafkaConsumer(
                    **client_kwargs(self.settings),
                    enable_auto_commit=False,
                    auto_offset_reset="earliest",
                    isolation_level=ISOLATION_LEVEL,
                ),
                "read-back consumer",
            )
        return self._consumer

    async def log_start(self, topic: str, partition: int) -> int:
        async with self._lock:
            consumer = await self._client()
            tp = TopicPartition(topic, partition)
            starts = await consumer.beginning_offsets([tp])
            return int(starts[tp])

    async def log_end(self, topic: str, partition: int) -> int:
        """The partition's end offset now (the offset its next record will get)."""
        async with self._lock:
            consumer = await self._client()
            tp = TopicPartition(topic, partition)
            ends = await consumer.end_offsets([tp])
            return int(ends[tp])

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[InRecord]:
        """Records with ``start <= offset < end`` (fewer when some are no longer in the log)."""
        async with self._lock:
            consumer = await self._client()
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            consumer.seek(tp, start)
            out: list[InRecord] = []
            while await consumer.position(tp) < end:
                # Short waits: a range that holds only transaction markers or aborted records
                # (read_committed) returns no record, but the position moves past it at once.
                batch = await consumer.getmany(tp, timeout_ms=100)
                for m in batch.get(tp, []):
                    if start <= m.offset < end:
                        out.append(InRecord(m.topic, m.partition, m.offset, m.key, m.value, list(m.headers), m.timestamp))
            return out

    async def stop(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.stop()


@dataclass
class Batch:
    """A batch's input in order per partition, and what to write once it is processed."""

    records: list[InRecord]
    #: The next-offset rows, to be written after the batch's state rows.
    offset_rows: dict[tuple[int, bytes], bytes]
    #: (topic, partition, first, last) read back from Kafka; reported to Faust after the write.
    backfilled: list[tuple[str, int, int, int]]


class OrderedInput:
    """Per input partition, exactly the next records after the last processed one.

    ``stores`` are the tables that hold the handler's next-offset rows: one table, or every
    table the handler writes state to (each keeps a copy, and the smallest is where the
    input resumes).
    """

    def __init__(
        self,
        app: faust.App,
        stores: OffsetStore | Sequence[OffsetStore],
        backfill: Backfill,
        *,
        read_committed: bool = False,
        service: str = "",
        input_ids: Callable[[str], str | None] | None = None,
    ) -> None:
        self.app = app
        self.service = service
        #: An input topic's current topic id, as the brokers last reported it (None: not known):
        #: the next-offset rows name it, so that those of a deleted input are not taken for its
        #: successor's (see :meth:`next_offset`).
        self.input_ids = input_ids
        self.stores: tuple[OffsetStore, ...] = tuple(stores) if isinstance(stores, Sequence) else (stores,)
        if not self.stores:
            raise ValueError("OrderedInput needs at least one table for its next offsets")
        self.backfill = backfill
        self.replays_dropped = 0
        self.records_backfilled = 0
        #: Reading committed records only (the engine always does): every transaction leaves an offset
        #: without a record (its commit or abort marker), and an aborted transaction leaves its
        #: records' offsets too. See :meth:`batch_records`.
        self.read_committed = read_committed
        #: Per input partition, a range of offsets known to hold no committed record.
        self._empty: dict[tuple[str, int], tuple[int, int]] = {}
        self.empty_gaps_accepted = 0
        #: Per input partition, the input incarnation (topic id) its offset rows were last seen to
        #: name, and those found to name another (see :meth:`next_offset`).
        self._named: dict[tuple[str, int], str] = {}
        self._stale_warned: set[tuple[str, int, str]] = set()

    def next_offset(self, topic: str, partition: int) -> int | None:
        """The next offset to process, or ``None`` when a table has none (start at the log start).

        A table added to the handler later (:func:`offsets_optional`) that has none yet does not
        count: an instance upgraded to a version with the new table resumes where its other
        tables are, instead of reading the whole retained input back in one batch. (Its rows of a
        batch whose other tables' rows alone reached the changelog are then missing; a table may
        be marked so only where the handler rebuilds such rows.)"""
        key = next_offset_key(topic)
        if self._counts_another_input(topic, partition):
            return None
        found: list[int] = []
        for store in self.stores:
            raw = store.get(partition, key)
            if raw is None:
                if offsets_optional(store):
                    continue
                return None
            found.append(int(raw))
        return min(found) if found else None

    def _input_id(self, topic: str) -> str | None:
        return self.input_ids(topic) if self.input_ids is not None else None

    def _counts_another_input(self, topic: str, partition: int) -> bool:
        """Whether the next offsets the tables hold for ``partition`` of ``topic`` count another
        incarnation of that input (the topic deleted and created again since): they are then
        none at all, and the input is read from its start. Rows of an earlier version, which
        named none, count the input there is."""
        current = self._input_id(topic)
        if current is None or self._named.get((topic, partition)) == current:
            return False
        for store in self.stores:
            raw = store.get(partition, input_id_key(topic))
            if raw is not None and raw.decode() != current:
                if (topic, partition, raw.decode()) not in self._stale_warned:
                    self._stale_warned.add((topic, partition, raw.decode()))
                    log.warning(
                        "the next offsets kept for %s[%d] count an input deleted and created again since "
                        "(topic id %s → %s): reading it from its start",
                        topic,
                        partition,
                        raw.decode(),
                        current,
                    )
                    LOCAL_STATE_DISCARDED.labels(self.service, getattr(store, "name", ""), "input_recreated").inc()
                return True
        return False

    def _name_input(self, topic: str, partition: int, offset_rows: dict[tuple[int, bytes], bytes]) -> None:
        """Add the row naming the input's incarnation to a batch's offset rows, unless the tables
        already hold it."""
        current = self._input_id(topic)
        if current is None or self._named.get((topic, partition)) == current:
            return
        if all(store.get(partition, input_id_key(topic)) == current.encode() for store in self.stores):
            self._named[(topic, partition)] = current  # committed: no need to look again
        else:
            offset_rows[(partition, input_id_key(topic))] = current.encode()

    async def batch_records(self, arrivals: Sequence[InRecord], continues_from: int | None = None) -> Batch:
        """The batch's records to process, in order per partition, with its next-offset rows.

        ``continues_from`` (one partition's arrivals only): the offset after the last record the
        consumer handed over before, when these arrivals continue that fetch (no seek or
        rebalance in between). Reading committed records, a gap from there to the first arrival
        was read by the consumer itself and holds no committed record (the marker of the
        transaction that wrote the previous record, aborted records): it is accepted without a
        read-back when the handler has processed everything before it."""
        by_tp: dict[tuple[str, int], list[InRecord]] = {}
        for record in arrivals:
            by_tp.setdefault((record.topic, record.partition), []).append(record)
        records: list[InRecord] = []
        offset_rows: dict[tuple[int, bytes], bytes] = {}
        backfilled: list[tuple[str, int, int, int]] = []
        for (topic, partition), arrived in by_tp.items():
            expected = self.next_offset(topic, partition)
            if expected is None:
                expected = await self.backfill.log_start(topic, partition)
            for i, record in enumerate(arrived):
                if record.offset < expected:
                    self.replays_dropped += 1
                    continue
                if record.offset > expected and self.read_committed:
                    if i > 0:
                        # A gap between two records of one fetch: the consumer read those offsets
                        # and they held no committed record (markers, aborted records). Nothing
                        # was skipped, so nothing is read back.
                        self.empty_gaps_accepted += 1
                        expected = record.offset
                    elif continues_from is not None and continues_from <= expected:
                        self.empty_gaps_accepted += 1
                        expected = record.offset
                    else:
                        expected = self._past_known_empty(topic, partition, expected, record.offset)
                if record.offset > expected:
                    missing = await self.backfill.read(topic, partition, expected, record.offset)
                    if self.read_committed and not missing:
                        # Nothing committed there: the marker of the transaction that wrote the
                        # previous record (the usual gap before a fetch's first record), or an
                        # aborted transaction. Nothing was skipped.
                        self.empty_gaps_accepted += 1
                    else:
                        log.warning(
                            "the stream skipped %s[%d] offsets %d..%d; read back %d records from Kafka",
                            topic,
                            partition,
                            expected,
                            record.offset - 1,
                            len(missing),
                        )
                        records.extend(missing)
                        self.records_backfilled += len(missing)
                        backfilled.append((topic, partition, expected, record.offset - 1))
                records.append(record)
                expected = record.offset + 1
            offset_rows[(partition, next_offset_key(topic))] = str(expected).encode()
            self._name_input(topic, partition, offset_rows)
        return Batch(records=records, offset_rows=offset_rows, backfilled=backfilled)

    def _past_known_empty(self, topic: str, partition: int, start: int, end: int) -> int:
        """``start``, moved past a range known to hold no committed record, up to ``end``."""
        known = self._empty.get((topic, partition))
        if known is not None and known[0] <= start < known[1]:
            return min(known[1], end)
        return start

    def settled_offset(self, topic: str, partition: int) -> int | None:
        """:meth:`next_offset`, moved past offsets known to hold no committed record (the marker
        of the last transaction): where the handler is when nothing more is to be processed."""
        expected = self.next_offset(topic, partition)
        if expected is None or not self.read_committed:
            return expected
        known = self._empty.get((topic, partition))
        if known is not None and known[0] <= expected < known[1]:
            return known[1]
        return expected

    async def confirm_empty(self, topic: str, partition: int, start: int, end: int) -> bool:
        """With read_committed: whether offsets ``start`` to ``end - 1`` hold no committed record
        (read back once and remembered, so the next batch and the trailing-hole watch need not
        read them again). Always False when reading uncommitted records."""
        if not self.read_committed or start >= end:
            return start >= end
        known = self._empty.get((topic, partition))
        if known is not None and known[0] <= start and end <= known[1]:
            return True
        if await self.backfill.read(topic, partition, start, end):
            return False
        self._empty[(topic, partition)] = (start, end)
        return True

    def writes(self, batch: Batch, state: Mapping[DurableTable, Rows] | None = None) -> list[tuple[DurableTable, Rows]]:
        """For ``write_all``: each table's state rows from ``state``, then the batch's
        next-offset rows, for every table of this input (which must be :class:`DurableTable`)."""
        state = state or {}
        stray = [store for store in state if store not in self.stores]
        if stray:
            raise ValueError("state rows for a table that does not hold this input's next offsets")
        out: list[tuple[DurableTable, Rows]] = []
        for store in self.stores:
            if not isinstance(store, DurableTable):
                raise TypeError(f"cannot write to {store!r}")
            out.append((store, ordered_rows(state.get(store, {}).items(), batch.offset_rows.items())))
        return out


def ordered_rows(*parts: Iterable[tuple[tuple[int, bytes], bytes | None]]) -> dict[tuple[int, bytes], bytes | None]:
    """Rows in write order: state rows first, then the next-offset rows."""
    out: dict[tuple[int, bytes], bytes | None] = {}
    for part in parts:
        for row, value in part:
            out.pop(row, None)
            out[row] = value
    return out
