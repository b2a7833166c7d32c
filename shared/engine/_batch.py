"""One partition's batch as a handler sees it, and the one place a batch is committed.

A handler reads :attr:`InputBatch.records` and stages what the batch produces: records
to send (:meth:`InputBatch.send`, :meth:`InputBatch.dead_letter`), table rows to write
(:meth:`InputBatch.write`), rows derived from the batch's other changes and written once
as its commit begins (:meth:`InputBatch.before_commit`), and what to do once all of it is
durable (:meth:`InputBatch.after_commit`). It does no I/O of its own. :func:`commit` then
does, in this order and nowhere else:

0. the before-commit callbacks run (the batch still takes rows);
1. every staged record is sent and its acknowledgement awaited;
2. the table rows, coalesced per key, and the input's next offset go to the changelogs,
   and their acknowledgements are awaited;
3. rows, next offset and the changelog offset go into the local RocksDB partition in one
   write batch;
4. the after-commit callbacks run (in-memory state derived from the rows), with no
   await between 3 and 4.

A crash before 2 completes leaves the input's next offset where it was: the batch is
read again and its sends repeated (at-least-once; outputs carry ids derived from the
input, so readers recognise a repeat). A crash after 2 and before 3 leaves the local
database behind its changelog, which the next start restores from (the changelog offset
is written in 3).

With ``STATEFLEET_PROCESSING_GUARANTEE=exactly_once``, 1 and 2 are one Kafka transaction that
also holds the input's next offset, and 3 follows its commit (:func:`_commit_transaction`).

A batch's :class:`BatchStatus` follows those steps, each transition checked::

    STAGED ─► COMMITTING ─► SENT ─► LOGGED ─► APPLIED      (any but APPLIED ─► FAILED)

Only a STAGED batch takes sends, rows and callbacks, and only a STAGED batch is committed: a
write after its commit began, or a second commit, raises :class:`BatchStateError`. A batch of a
handler without tables goes from SENT to APPLIED (it has nothing to log) under at-least-once.
The batch's owner (its task, ``shared/engine/_task.py``) is told of each transition
(:attr:`InputBatch.on_status`): the crash and stop points of the crash tests are hooks there.
"""

from __future__ import annotations

import bisect
import enum
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.dead_letters import DeadLetter, dead_letter_for
from shared.engine._durable import Batch, DurableTable, InRecord, OrderedInput, Rows
from shared.engine._producer import BatchProducer, Outgoing, PartitionTransactions
from shared.metrics import BATCH_SECONDS, BATCH_STEP_SECONDS, DEAD_LETTERS_WRITTEN, MESSAGES_PROCESSED

Headers = Sequence[tuple[str, bytes]] | None
#: Raises when this consumer may no longer be the member that owns the batch's partition.
Fence = Callable[[], Awaitable[None]]
_NOT_STAGED = object()


class BatchStatus(enum.Enum):
    """Where a batch is in its commit (see the module docs)."""

    STAGED = "staged"
    COMMITTING = "committing"
    SENT = "sent"
    LOGGED = "logged"
    APPLIED = "applied"
    FAILED = "failed"


_NEXT_STATUS: dict[BatchStatus, frozenset[BatchStatus]] = {
    BatchStatus.STAGED: frozenset({BatchStatus.COMMITTING, BatchStatus.FAILED}),
    BatchStatus.COMMITTING: frozenset({BatchStatus.SENT, BatchStatus.FAILED}),
    BatchStatus.SENT: frozenset({BatchStatus.LOGGED, BatchStatus.APPLIED, BatchStatus.FAILED}),
    BatchStatus.LOGGED: frozenset({BatchStatus.APPLIED, BatchStatus.FAILED}),
    BatchStatus.APPLIED: frozenset(),
    BatchStatus.FAILED: frozenset(),
}


class BatchStateError(RuntimeError):
    """A batch was asked for what its status does not allow (a write after its commit began, a
    second commit): a defect of the handler or of the engine, never of the input."""


@dataclass(slots=True)
class DeadLetterRoute:
    """Where a handler's rejected records go."""

    service: str
    topic: str
    retry_topic: str


@dataclass
class InputBatch:
    """Records of one input partition, in offset order, exactly once each (replays dropped, skipped
    offsets read back), and what the handler stages for :func:`commit`."""

    topic: str
    partition: int
    records: list[InRecord]
    dead_letter_route: DeadLetterRoute | None = None
    sends: list[Outgoing] = field(default_factory=list)
    rows: dict[DurableTable, dict[tuple[int, bytes], bytes | None]] = field(default_factory=dict)
    callbacks: list[Callable[[], None]] = field(default_factory=list)
    #: Run as the commit begins, before :attr:`callbacks` (:meth:`before_commit`).
    last_rows: list[Callable[[], None]] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    #: Input records this batch stands for, when not one per record (packed inputs).
    counted: int | None = None
    #: Where the batch is in its commit (see :class:`BatchStatus`).
    status: BatchStatus = BatchStatus.STAGED
    #: Told of each status the batch reaches (its task's hooks).
    on_status: Callable[[InputBatch, BatchStatus], None] | None = None
    #: When (``time.perf_counter()``) the batch was staged and reached each later status.
    staged_at: float = field(default_factory=time.perf_counter)
    reached_at: dict[BatchStatus, float] = field(default_factory=dict)
    _dbs: dict[tuple[DurableTable, int], Any] = field(default_factory=dict)

    def advance(self, status: BatchStatus) -> None:
        """Move to ``status``; raises :class:`BatchStateError` unless the current status leads there."""
        if status not in _NEXT_STATUS[self.status]:
            raise BatchStateError(
                f"batch of {self.topic}[{self.partition}] is {self.status.value}: it cannot become {status.value}"
            )
        self.status = status
        self.reached_at[status] = time.perf_counter()
        if self.on_status is not None:
            self.on_status(self, status)

    def _staging(self, what: str) -> None:
        if self.status is not BatchStatus.STAGED:
            raise BatchStateError(
                f"batch of {self.topic}[{self.partition}] is {self.status.value}: no {what} once its commit began"
            )

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        *,
        headers: Headers = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        """Stage a record to send; it is acknowledged before any state of this batch is written."""
        self._staging("send")
        self.sends.append(Outgoing(topic, key, value, headers, partition, timestamp_ms))

    def write(self, table: DurableTable, key: bytes, value: bytes | None, *, partition: int | None = None) -> None:
        """Stage a row (``None`` deletes it) in ``partition`` (default: the input partition). The last
        write of a key in a batch wins, and only it goes to the changelog."""
        self._staging("write")
        rows = self.rows.setdefault(table, {})
        row = (self.partition if partition is None else partition, key)
        rows.pop(row, None)  # keep write order: a rewritten key moves to the end
        rows[row] = value

    def read(self, table: DurableTable, key: bytes, *, partition: int | None = None) -> bytes | None:
        """A row as this batch sees it: staged writes first, then the table."""
        p = self.partition if partition is None else partition
        staged = self.rows.get(table)
        if staged is not None:
            value = staged.get((p, key), _NOT_STAGED)
            if value is not _NOT_STAGED:
                return value  # type: ignore[return-value]
        # The partition's database handle, kept for the batch (no rebalance happens during one).
        db = self._dbs.get((table, p))
        if db is None:
            db = self._dbs[(table, p)] = table.db(p)
        raw: bytes | None = db.get(key)
        return raw

    def view(self, table: DurableTable, *, partition: int | None = None) -> StagedView:
        """A partition of ``table`` as this batch sees it, for ordered scans: the stored rows with
        the batch's staged writes laid over them."""
        p = self.partition if partition is None else partition
        staged = {key: value for (row_partition, key), value in self.rows.get(table, {}).items() if row_partition == p}
        return StagedView(table, p, staged)

    def before_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` as the commit begins, while the batch still takes rows and callbacks:
        for a row that sums up the batch's other changes, written once rather than at each."""
        self._staging("before-commit callback")
        self.last_rows.append(callback)

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` right after the batch's rows are in the local tables."""
        self._staging("after-commit callback")
        self.callbacks.append(callback)

    def dead_letter(self, record: InRecord, error: BaseException) -> DeadLetter:
        """Stage ``record`` for ``dead-letters`` with the error in its headers."""
        self._staging("dead letter")
        route = self.dead_letter_route
        if route is None:
            raise RuntimeError("this handler has no dead-letter route")
        letter = dead_letter_for(
            record.key,
            record.value,
            record.headers,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            error=error,
            retry_topic=route.retry_topic,
        )
        self.send(route.topic, letter.key, letter.value, headers=letter.headers())
        self.dead_letters.append(letter)
        return letter


async def commit(
    producer: BatchProducer,
    order: OrderedInput | None,
    ordered: Batch | None,
    batch: InputBatch,
    what: str,
    transactions: PartitionTransactions | None = None,
    next_offset: int | None = None,
    member: Fence | None = None,
) -> None:
    """Make ``batch`` durable in the order the module docs give (with ``transactions``: as one
    transaction, see :func:`_commit_transaction`). The batch's status follows the steps; a
    failure leaves it FAILED.

    ``member`` (at-least-once): awaited before anything is sent and again before the local
    write; it raises when the consumer group may have handed the input partition to another
    member meanwhile (this process was stopped or cut off), and the batch then writes nothing
    more. Otherwise such a batch would append rows computed from a stale copy after the new
    owner's, and write their changelog offset, which is past the new owner's records, into the
    local database, whose next recovery would then skip those records."""
    try:
        for stage_last_rows in batch.last_rows:
            stage_last_rows()
    except BaseException:
        batch.advance(BatchStatus.FAILED)
        raise
    batch.advance(BatchStatus.COMMITTING)
    try:
        if transactions is not None:
            if next_offset is None:
                raise ValueError(f"{what}: a transactional commit needs the input's next offset")
            await _commit_transaction(transactions, order, ordered, batch, what, next_offset)
        else:
            await _commit_at_least_once(producer, order, ordered, batch, what, member)
    except BaseException:
        batch.advance(BatchStatus.FAILED)
        raise


async def _commit_at_least_once(
    producer: BatchProducer, order: OrderedInput | None, ordered: Batch | None, batch: InputBatch, what: str, member: Fence | None
) -> None:
    if member is not None:
        await member()
    await producer.send(batch.sends, what, member)
    batch.advance(BatchStatus.SENT)
    if order is None or ordered is None:
        if batch.rows:
            raise RuntimeError(f"{what}: a handler without an offsets table cannot write rows")
    else:
        await write_all(
            producer, order.writes(ordered, batch.rows), what, member, logged=lambda: batch.advance(BatchStatus.LOGGED)
        )
    for callback in batch.callbacks:
        callback()
    batch.advance(BatchStatus.APPLIED)


async def write_all(
    producer: BatchProducer,
    writes: Iterable[tuple[DurableTable, Rows]],
    what: str,
    member: Fence | None = None,
    logged: Callable[[], None] | None = None,
) -> None:
    """Every table's rows to its changelog, every acknowledgement awaited, and only then the rows
    (with each partition's changelog offset) into the local databases. Records of different
    changelogs can land in any order; only the order within one changelog partition is kept,
    which is why a handler writing several tables keeps its next-offset rows in each (see
    :meth:`OrderedInput.writes`). ``member``: see :func:`commit`; it awaits nothing while
    heartbeats confirm the member. ``logged`` is called once the changelogs acknowledged."""
    pending = [(table, rows) for table, rows in writes if rows]
    if member is not None and pending:
        # Again here: the process may have been stopped while the batch's outputs were being
        # acknowledged, and its rows must not follow the next owner's into the changelog.
        await member()
    last = await producer.send(changelog_records(pending), what, member)
    if logged is not None:
        logged()
    if member is not None:
        await member()
    apply_local(pending, last)


async def _commit_transaction(
    transactions: PartitionTransactions,
    order: OrderedInput | None,
    ordered: Batch | None,
    batch: InputBatch,
    what: str,
    next_offset: int,
) -> None:
    """exactly_once: the batch's records, its changelog rows and the input's ``next_offset`` (for
    the consumer group) in one Kafka transaction of the input partition's producer; the local
    tables are written only once it is committed, and the callbacks run right after, with no
    await in between. The batch is SENT once the transaction's records are acknowledged and
    LOGGED once it is committed.

    - A crash (or a failure) before the commit leaves nothing visible to committed readers: the
      transaction is aborted, by this worker, by the next owner initialising the partition's
      producer, or by the broker's transaction timeout; the batch is read again from the last
      committed offset and its next-offset rows, which were not committed either.
    - A crash after the commit and before the local write leaves the local database behind its
      changelog, which the next start restores from (the changelog offset goes in with the rows).
    - An aborted transaction never reaches a local table: rows go in only after the commit, and
      restores read committed records only.
    """
    pending: list[tuple[DurableTable, Rows]] = []
    if order is None or ordered is None:
        if batch.rows:
            raise RuntimeError(f"{what}: a handler without an offsets table cannot write rows")
    else:
        pending = [(table, rows) for table, rows in order.writes(ordered, batch.rows) if rows]
    records = [*batch.sends, *changelog_records(pending)]

    def reached(point: str) -> None:
        if point == "sent":
            batch.advance(BatchStatus.SENT)

    last = await transactions.commit(batch.topic, batch.partition, records, next_offset, what, reached)
    batch.advance(BatchStatus.LOGGED)
    apply_local(pending, last)
    for callback in batch.callbacks:
        callback()
    batch.advance(BatchStatus.APPLIED)


def batch_steps(batch: InputBatch, started: float) -> dict[str, float]:
    """Seconds of each step of a batch's delivery: ``read`` (its records, skipped ones read back),
    ``handle`` (the handler), ``send`` (outputs acknowledged; exactly_once: the transaction
    committed), ``log`` (changelog rows acknowledged), ``apply`` (the local write). A step the
    batch did not reach is left out."""
    at = batch.reached_at
    marks = [
        ("read", batch.staged_at),
        ("handle", at.get(BatchStatus.COMMITTING)),
        ("send", at.get(BatchStatus.SENT)),
        ("log", at.get(BatchStatus.LOGGED)),
        ("apply", at.get(BatchStatus.APPLIED)),
    ]
    steps: dict[str, float] = {}
    previous = started
    for step, mark in marks:
        if mark is None:
            continue
        steps[step] = max(0.0, mark - previous)
        previous = mark
    return steps


def changelog_records(pending: Sequence[tuple[DurableTable, Rows]]) -> list[Outgoing]:
    return [
        Outgoing(table.changelog, key, value, partition=partition)
        for table, rows in pending
        for (partition, key), value in rows.items()
    ]


def apply_local(pending: Sequence[tuple[DurableTable, Rows]], last: dict[tuple[str, int], int]) -> None:
    """Rows and each partition's changelog offset into the local databases."""
    for table, rows in pending:
        table.apply_rows(rows, {partition: offset for (topic, partition), offset in last.items() if topic == table.changelog})


def observe(service: str, stream: str, batch: InputBatch, started: float) -> None:
    """A processed batch's counts and times (``started``: when its delivery began, on ``time.perf_counter()``)."""
    MESSAGES_PROCESSED.labels(service, stream).inc(len(batch.records) if batch.counted is None else batch.counted)
    BATCH_SECONDS.labels(service, stream).observe(time.perf_counter() - started)
    for step, seconds in batch_steps(batch, started).items():
        BATCH_STEP_SECONDS.labels(service, stream, step).observe(seconds)
    for letter in batch.dead_letters:
        DEAD_LETTERS_WRITTEN.labels(service, letter.error_class).inc()


class StagedView:
    """A table partition with a batch's staged rows over it (``iter()`` as rocksdict's raw
    iterator: ``seek``, ``valid``, ``key``, ``value``, ``next``), without the engine's rows, as
    :meth:`DurableTable.view` gives them."""

    def __init__(self, table: DurableTable, partition: int, staged: dict[bytes, bytes | None]) -> None:
        self.table = table
        self.partition = partition
        self.staged = staged

    def get(self, key: bytes) -> bytes | None:
        if key in self.staged:
            return self.staged[key]
        return self.table.view(self.partition).get(key)

    def iter(self) -> _MergedIterator:
        return _MergedIterator(self.table.view(self.partition).iter(), self.staged)


class _MergedIterator:
    def __init__(self, stored: Any, staged: dict[bytes, bytes | None]) -> None:
        self._stored = stored
        self._staged = staged
        self._keys = sorted(staged)
        self._i = 0
        self._current: tuple[bytes, bytes] | None = None
        self._from_stored = False

    def seek(self, key: bytes) -> None:
        self._stored.seek(key)
        self._i = bisect.bisect_left(self._keys, key)
        self._settle()

    def seek_to_first(self) -> None:
        self.seek(b"")

    def _settle(self) -> None:
        while True:
            stored_key = bytes(self._stored.key()) if self._stored.valid() else None
            staged_key = self._keys[self._i] if self._i < len(self._keys) else None
            if staged_key is not None and (stored_key is None or staged_key <= stored_key):
                if stored_key == staged_key:
                    self._stored.next()  # the staged row replaces the stored one
                self._i += 1
                value = self._staged[staged_key]
                if value is None:
                    continue  # staged delete
                self._current, self._from_stored = (staged_key, value), False
                return
            if stored_key is None:
                self._current = None
                return
            self._current, self._from_stored = (stored_key, bytes(self._stored.value())), True
            return

    def valid(self) -> bool:
        return self._current is not None

    def key(self) -> bytes:
        assert self._current is not None
        return self._current[0]

    def value(self) -> bytes:
        assert self._current is not None
        return self._current[1]

    def next(self) -> None:
        if self._from_stored:
            self._stored.next()
        self._settle()
