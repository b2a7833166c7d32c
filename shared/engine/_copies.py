"""Which copy of a table partition this instance holds, and how far behind its changelog it is.

Reads must not wait for one instance (docs/contract.md, "Availability"): when a key's active
owner cannot answer, another instance answers from its own copy of the partition. An
instance can hold a copy in three ways, and each answer says which:

* ``active`` — it owns the partition and processes its input (recovery done, no
  rebalance under way). It writes the changelog itself, so it is never behind it.
* ``restoring`` — it owns the partition but is still restoring it from the changelog.
* ``standby`` — a standby replica Faust keeps up to date from the changelog, or the
  local database of a partition this instance owned before (a previous owner's copy is
  as fresh as the moment it gave the partition up, and its lag says how stale that is).

The lag is the number of changelog records the copy has not applied: the changelog's
end offset, as last known, minus the next offset the local database expects (the
changelog offset stored with every write batch, see :mod:`shared.engine._durable`), taken
over every table co-partitioned with the one read (they are restored together, each from its
own changelog, and a read may answer from any of them): the least fresh one sets the lag.
End offsets come from the worker's consumer where it fetches the changelog (standbys)
and otherwise from a plain consumer of this module, asked at most once per
:data:`END_MAX_AGE_S` per changelog, within :data:`END_LOOKUP_TIMEOUT_S`: a read never
waits long for the broker either. A last known end older than :data:`END_TRUSTED_S` gives
no lag at all (unknown): an end offset only grows, so an old one makes a copy look fresher
than it is. After a stall of the process (stopped, frozen) every end it knows is from before
the stall, and the copies it restores or keeps would otherwise claim to be up to date
(lag 0) while they are still far behind.

Under ``exactly_once`` a changelog ends with the last transaction's commit marker, an offset
that holds no record a copy could apply: an up-to-date copy would report a lag of at least
1. Every write of the engine is transactional there (once a switch from at_least_once has
committed its first transaction), so a lag of exactly 1 is that marker
and counts as 0. A lag of 2 to :data:`MARKERS_CHECKED` can be markers too (two transactions
committed together, an aborted one): a read that needs it exactly (``exact``: the copy a
query is answered from) reads that range back once, read_committed, and remembers what it
found, so a copy that stays where it is is not read again; the fleet view and the warm-up
measures take the lag as counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import faust
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP
from faust.types import TP

from shared.engine._clients import ISOLATION_LEVEL, client_kwargs, exactly_once, started_when_reachable
from shared.engine._context import context_of
from shared.engine._faust import AnyTable, recovery_done, store_partition_db
from shared.engine._identity import Incarnation, current_incarnations, recorded_is_current
from shared.engine._rocksdb import persisted_offset
from shared.settings import Settings

log = logging.getLogger(__name__)

Source = Literal["active", "standby", "restoring"]

#: How old a changelog end offset may be before a read asks the broker again.
END_MAX_AGE_S = 1.0
#: Longest a read waits for the broker's end offsets before it answers with the last known.
END_LOOKUP_TIMEOUT_S = 0.5
#: Oldest answer of the broker a lag is computed from; past it the lag is unknown.
END_TRUSTED_S = 5.0
#: Under exactly_once, a lag this small is read back to tell transaction markers from records.
MARKERS_CHECKED = 16


@dataclass(frozen=True, slots=True)
class Copy:
    """This instance's copy of one table partition."""

    source: Source
    #: Changelog records not yet applied to it (None: the changelog's end is not known yet).
    lag: int | None


class ChangelogEnds:
    """End offsets of changelog partitions, cached per topic for :data:`END_MAX_AGE_S`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._consumer: AIOKafkaConsumer | None = None
        self._ends: dict[TP, int] = {}
        self._asked: dict[str, float] = {}
        self._lock = asyncio.Lock()
        self._refreshing: dict[str, asyncio.Future[None]] = {}
        self._stopped = False
        #: Whether changelogs are written in transactions (their ends can be commit markers).
        self.transactional = exactly_once(settings)
        #: Per changelog partition, the last offset range read back and found to hold no record.
        self._no_records: dict[TP, tuple[int, int]] = {}
        #: Per changelog partition, the offset of the last committed record a read-back found.
        self._record_at: dict[TP, int] = {}
        #: Each changelog's incarnation as the brokers last reported it (see
        #: :mod:`shared.engine._identity`): a copy that recorded another is never read from.
        self.incarnations: dict[str, Incarnation] = {}

    async def end(self, tp: TP, partitions: int) -> int | None:
        """The end offset of ``tp`` as last known, asked anew when older than :data:`END_MAX_AGE_S`
        (not after :meth:`stop`: a worker shutting down answers with what it knew); None when
        the broker's last answer is older than :data:`END_TRUSTED_S` (see the module docs)."""
        if not self._stopped and time.monotonic() - self._asked.get(tp.topic, float("-inf")) >= END_MAX_AGE_S:
            refresh = self._refreshing.get(tp.topic)
            if refresh is None or refresh.done():
                # Left to finish when this read stops waiting for it: on a slow broker (or a
                # process catching up after a stall) each read's lookup would be cancelled in
                # turn and the ends never learnt.
                refresh = self._refreshing[tp.topic] = asyncio.ensure_future(self._refresh(tp.topic, partitions))
                refresh.add_done_callback(_retrieve)
            try:
                await asyncio.wait_for(asyncio.shield(refresh), END_LOOKUP_TIMEOUT_S)
            except TimeoutError:
                log.debug("end offsets of %s not known within %.1fs; using the last known", tp.topic, END_LOOKUP_TIMEOUT_S)
            except Exception as exc:  # the broker is away: the last known end stands
                log.debug("end offsets of %s: %s", tp.topic, exc)
        if not self._stopped and time.monotonic() - self._asked.get(tp.topic, float("-inf")) > END_TRUSTED_S:
            return None
        return self._ends.get(tp)

    async def start(self) -> None:
        """Connect ahead of the first read, which would otherwise wait for the connection."""
        async with self._lock:
            await self._client()

    async def _client(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            self._consumer = await started_when_reachable(
                lambda: AIOKafkaConsumer(
                    **client_kwargs(self.settings), enable_auto_commit=False, isolation_level=ISOLATION_LEVEL
                ),
                "changelog end-offset reader",
            )
        return self._consumer

    async def _refresh(self, topic: str, partitions: int) -> None:
        async with self._lock:
            if time.monotonic() - self._asked.get(topic, float("-inf")) < END_MAX_AGE_S:
                return  # another read refreshed it while this one waited
            consumer = await self._client()
            asked = time.monotonic()  # the ends are at least as recent as the question
            ends = await consumer.end_offsets([KafkaTP(topic, p) for p in range(partitions)])
            for ktp, end in ends.items():
                self._ends[TP(ktp.topic, ktp.partition)] = int(end)
            self._asked[topic] = asked

    async def holds_no_records(self, tp: TP, start: int, end: int) -> bool:
        """Whether offsets ``start`` to ``end - 1`` of ``tp`` hold no committed record (only
        transaction markers or aborted records), read back once and remembered."""
        known = self._no_records.get(tp)
        if known is not None and known[0] <= start and end <= known[1]:
            return True
        record_at = self._record_at.get(tp)
        if record_at is not None and start <= record_at < end:
            return False
        async with self._lock:
            consumer = await self._client()
            ktp = KafkaTP(tp.topic, tp.partition)
            consumer.assign([ktp])
            try:
                consumer.seek(ktp, start)
                while await consumer.position(ktp) < end:
                    # A range of markers only returns no record, but moves the position past it.
                    fetched = await consumer.getmany(ktp, timeout_ms=100)
                    found = [m.offset for m in fetched.get(ktp, []) if start <= m.offset < end]
                    if found:
                        self._record_at[tp] = found[-1]
                        return False
            finally:
                consumer.unsubscribe()  # or its fetcher would go on reading the partition
        self._no_records[tp] = (start, end)
        return True

    def saw(self, tp: TP, end: int) -> None:
        if end > self._ends.get(tp, -1):
            self._ends[tp] = end

    async def stop(self) -> None:
        self._stopped = True
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.stop()


def _retrieve(refresh: asyncio.Future[None]) -> None:
    """Mark the outcome of a lookup no read waited for as seen (its failure is logged where awaited)."""
    if not refresh.cancelled():
        refresh.exception()


def track_copies(app: faust.App, settings: Settings) -> None:
    """Let :func:`local_copy` tell ``app``'s copies' lag (once per app, before the worker starts)."""
    context = context_of(app)
    if context is None:
        raise ValueError("the app was not created by the engine (shared.engine._app.create_app)")
    context.copies = ChangelogEnds(settings)


def _ends(app: faust.App) -> ChangelogEnds | None:
    context = context_of(app)
    return context.copies if context is not None else None


async def start_tracking(app: faust.App) -> None:
    ends = _ends(app)
    if ends is not None:
        await ends.start()
        # Known before the first recovery checks them, so that a previous owner's copy on disk
        # can answer reads meanwhile, if it belongs to the changelogs there are now.
        topics = {cast(AnyTable, table).changelog_topic.get_topic_name() for table in app.tables.values()}
        topics |= set(getattr(app, "input_topics", ()))
        try:
            ends.incarnations.update(await current_incarnations(client_kwargs(ends.settings), topics))
        except Exception as exc:  # the first recovery reads them again
            log.info("could not read the changelogs' topic ids yet: %s", exc)


def note_incarnations(app: faust.App, incarnations: dict[str, Incarnation]) -> None:
    """Remember the incarnations of changelogs and inputs a recovery read (see :func:`local_copy`
    and :class:`~shared.engine._durable.OrderedInput`)."""
    ends = _ends(app)
    if ends is not None:
        ends.incarnations.update(incarnations)


def incarnation_of(app: faust.App, topic: str) -> Incarnation | None:
    """``topic``'s incarnation as the brokers last reported it to this worker (None: not known)."""
    ends = _ends(app)
    return ends.incarnations.get(topic) if ends is not None else None


async def stop_tracking(app: faust.App) -> None:
    ends = _ends(app)
    if ends is not None:
        await ends.stop()


def table_store(table: AnyTable) -> Any:
    return cast(Any, table).data


def copy_source(app: faust.App, table: AnyTable, partition: int) -> Source | None:
    """Which copy of ``partition`` of ``table`` this instance holds (None: none at all)."""
    tp = TP(table.changelog_topic.get_topic_name(), partition)
    assignor = cast(Any, app.assignor)
    if tp in assignor.assigned_actives():
        if app.rebalancing:
            return "standby"  # current as of the rebalance's start, not processing meanwhile
        return "active" if recovery_done(app) else "restoring"
    if tp in assignor.assigned_standbys():
        return "standby"
    # A partition this instance owned or kept before: its database is still on disk.
    path: Path = table_store(table).partition_path(partition)
    return "standby" if path.is_dir() else None


async def local_copy(
    app: faust.App,
    table: AnyTable,
    partition: int,
    *,
    exact: bool = False,
    measured: dict[tuple[str, int], Copy | None] | None = None,
) -> Copy | None:
    """This instance's copy of ``partition`` of ``table`` with its lag, or None when it has none.

    The copy is that of every table co-partitioned with ``table`` (see :func:`_restored_with`):
    it answers as fresh as the least fresh of them, and as none when one of them has none. A
    copy whose database cannot be opened (still locked by a closing handle) counts as none.
    ``measured`` keeps each table's copy for the caller's next calls: one that measures every
    table's every partition then looks at each copy once rather than once per co-partitioned table.
    """
    copies: list[Copy] = []
    for each in _restored_with(app, table):
        if measured is None:
            copy = await _table_copy(app, each, partition, exact=exact)
        elif (key := (each.name, partition)) in measured:
            copy = measured[key]
        else:
            copy = measured[key] = await _table_copy(app, each, partition, exact=exact)
        if copy is None:
            return None
        copies.append(copy)
    return Copy(
        max((copy.source for copy in copies), key=_SOURCE_RANK.__getitem__),
        None if any(copy.lag is None for copy in copies) else max(copy.lag or 0 for copy in copies),
    )


#: Least fresh last.
_SOURCE_RANK: dict[Source, int] = {"active": 0, "standby": 1, "restoring": 2}


def _restored_with(app: faust.App, table: AnyTable) -> list[AnyTable]:
    """``table`` and the app's other tables with as many partitions.

    Faust assigns partition p of co-partitioned tables to the same instances and restores
    them in the same recovery, but each from its own changelog, each at its own pace; and a
    read of one table commonly answers from the others' same partition too (a tally: its
    counts from memberships, its last login from last-logins). A copy that counted only the
    table a read is routed by would claim to be caught up (lag 0) while another it reads from
    is still being restored or is further behind (a tally with no last login yet, from an
    instance restoring the partition after it rejoined the group)."""
    count = _partition_count(app, table)
    others = [cast(AnyTable, t) for t in app.tables.values() if t is not table]
    return [table, *(t for t in others if _partition_count(app, t) == count)]


def _partition_count(app: faust.App, table: AnyTable) -> int:
    return int(table.partitions or app.conf.topic_partitions)


async def _table_copy(app: faust.App, table: AnyTable, partition: int, *, exact: bool = False) -> Copy | None:
    """This instance's copy of ``partition`` of ``table`` alone, with its lag (None: no copy)."""
    source = copy_source(app, table, partition)
    if source is None:
        return None
    if source == "active":
        return Copy("active", 0)
    tp = TP(table.changelog_topic.get_topic_name(), partition)
    ends = _ends(app)
    try:
        db = store_partition_db(table_store(table), partition)
        if ends is not None and not recorded_is_current(db, ends.incarnations.get(tp.topic)):
            # Not checked against the changelog there is now (a copy from before the topics
            # were recreated, say): never read from until a recovery has checked it.
            return None
        offset = persisted_offset(db)
        applied = offset + 1 if offset is not None else None
    except Exception as exc:  # rocksdict raises plain Exceptions for a locked or damaged database
        log.warning("cannot read the local copy of %s[%d]: %s", table.name, partition, exc)
        return None
    end: int | None = None
    if ends is not None:
        consumer_end = _consumer_highwater(app, tp)
        if consumer_end is not None:
            ends.saw(tp, consumer_end)
        end = await ends.end(tp, table.partitions or partition + 1)
    if end is None:
        return Copy(source, None)
    lag = max(0, end - (applied or 0))
    if ends is not None and ends.transactional and lag == 1:
        return Copy(source, 0)  # the last transaction's commit marker
    if ends is not None and ends.transactional and exact and applied is not None and 0 < lag <= MARKERS_CHECKED:
        try:
            if await asyncio.wait_for(ends.holds_no_records(tp, applied, end), END_LOOKUP_TIMEOUT_S):
                lag = 0  # what is left is the last transaction's marker (or aborted records)
        except Exception as exc:  # no answer in time, or the broker away: the lag as counted
            log.debug("could not read %s[%d] back from %d to %d: %r", tp.topic, tp.partition, applied, end, exc)
    return Copy(source, lag)


async def lag_without_copy(app: faust.App, table: AnyTable, partition: int) -> int | None:
    """Changelog records a copy of ``partition`` would have to apply starting from nothing: the
    changelog's end offset as last known (None: not known)."""
    ends = _ends(app)
    if ends is None:
        return None
    tp = TP(table.changelog_topic.get_topic_name(), partition)
    return await ends.end(tp, table.partitions or partition + 1)


def _consumer_highwater(app: faust.App, tp: TP) -> int | None:
    try:
        highwater = cast(Any, app.consumer).highwater(tp)
    except Exception:  # not started yet, or the partition is not assigned to the consumer
        return None
    return int(highwater) if highwater is not None else None


async def assigned_copies(app: faust.App) -> dict[str, dict[int, Copy]]:
    """Changelog topic -> partition -> this instance's copy, for every partition of every table
    assigned to it (as active or standby)."""
    assignor = cast(Any, app.assignor)
    assigned = set(assignor.assigned_actives()) | set(assignor.assigned_standbys())
    out: dict[str, dict[int, Copy]] = {}
    for table in app.tables.values():
        topic = table.changelog_topic.get_topic_name()
        for tp in sorted(tp for tp in assigned if tp.topic == topic):
            copy = await local_copy(app, cast(AnyTable, table), tp.partition)
            if copy is not None:
                out.setdefault(topic, {})[tp.partition] = copy
    return out
