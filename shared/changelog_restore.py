"""Restore table partitions from their changelogs in bulk, before Faust's recovery reads them.

Faust's recovery hands each changelog record through an asyncio queue and a per-record
bookkeeping loop: about 10,000 records/s on two cores, so a million-row partition set
that an instance takes over without a caught-up local copy (a cold start, a lost data
dir, a new instance, a failover without a standby) keeps its keys unanswerable for
minutes. Reading the same records with a plain consumer and writing them to RocksDB in
write batches is more than an order of magnitude faster.

So with ``bulk_restore`` on (the default; ``STATEFLEET_BULK_RESTORE``), the fleet's table
manager (:class:`BulkRestoringTableManager`) gives Faust a recovery
service (:class:`BulkRestoringRecovery`) that, after every rebalance, first reads each
assigned partition (active or standby) whose local copy lags its changelog by at least
``bulk_restore_min_lag`` records: from the partition's persisted offset to the changelog's
end offset (for actives, the highwater Faust has just read), writing the rows (a record
with no value deletes its key) and advancing the persisted offset, and Faust's own
offset for the partition, after each write batch. Faust's reader then starts from there,
reads whatever arrived since, and runs the tables' ``on_recover`` callbacks as before.
A crash mid-restore leaves rows and offset consistent: the rows of a batch are written
before the offset that covers them, and re-applying a changelog record is harmless (last
write wins, in log order).

It runs in Faust's recovery service, after the rebalance has completed: the consumer
heartbeats meanwhile, and a new rebalance cancels it as it cancels Faust's own steps.
Restoring standbys too means a standby is caught up right after the rebalance that gave
it to this instance, so a failover soon after a scale-out finds a complete local copy.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.stores.rocksdb import Store as RocksDBStore
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.types import TP, ConsumerT
from rocksdict import Rdict, WriteBatch

from shared.faust_internals import store_partition_db
from shared.kafka_clients import client_kwargs
from shared.settings import Settings

log = logging.getLogger(__name__)

#: Settings of each app whose table manager restores in bulk (Faust builds it from the app alone).
_SETTINGS: weakref.WeakKeyDictionary[faust.App, Settings] = weakref.WeakKeyDictionary()

PROGRESS_EVERY_S = 5.0


class PartitionTarget(Protocol):
    """Where one changelog partition is restored to."""

    def db(self) -> Rdict: ...

    def persisted_offset(self) -> int | None: ...

    def set_persisted_offset(self, offset: int) -> None: ...


@dataclass
class RestoreResult:
    records: int
    seconds: float
    partitions: int

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


async def restore_changelog(
    settings: Settings,
    targets: Mapping[TopicPartition, PartitionTarget],
    min_lag: int,
    *,
    limits: Mapping[TopicPartition, int] | None = None,
    budget_s: float | None = None,
) -> RestoreResult:
    """Bring each target up to its changelog partition's current end offset (or its
    ``limits`` entry, if lower), if it lags by ``min_lag`` or more; stop after ``budget_s``."""
    started = time.perf_counter()
    consumer = AIOKafkaConsumer(
        **client_kwargs(settings), enable_auto_commit=False, auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024,
    )
    await consumer.start()
    try:
        ends = {tp: int(end) for tp, end in (await consumer.end_offsets(list(targets))).items()}
        for tp, limit in (limits or {}).items():
            ends[tp] = min(ends[tp], limit)
        starts = {tp: (targets[tp].persisted_offset() or -1) + 1 for tp in targets}
        todo = {tp: ends[tp] for tp in targets if ends[tp] - starts[tp] >= max(min_lag, 1)}
        if not todo:
            return RestoreResult(0, time.perf_counter() - started, 0)
        total = sum(ends[tp] - starts[tp] for tp in todo)
        log.info("bulk restore: %d partitions lag their changelogs by %d records; reading them directly",
                 len(todo), total)
        consumer.assign(list(todo))
        for tp in todo:
            consumer.seek(tp, starts[tp])
        records = 0
        last_report = time.perf_counter()
        remaining = dict(todo)
        while remaining:
            if budget_s is not None and time.perf_counter() - started > budget_s:
                log.warning("bulk restore: stopping after %.0fs with %d partitions not caught up; "
                            "Faust's recovery reads the rest", budget_s, len(remaining))
                break
            batches = await consumer.getmany(*remaining, timeout_ms=1000, max_records=20_000)
            for tp, messages in batches.items():
                records += write_batch(targets[tp], messages)
            for tp in list(remaining):
                if await consumer.position(tp) >= remaining[tp]:
                    del remaining[tp]
            if time.perf_counter() - last_report >= PROGRESS_EVERY_S:
                last_report = time.perf_counter()
                log.info("bulk restore: %d of about %d records (%.0f/s), %d partitions to go",
                         records, total, records / (last_report - started), len(remaining))
        result = RestoreResult(records, time.perf_counter() - started, len(todo))
        log.info("bulk restore: %d records into %d partitions in %.1fs (%.0f records/s)",
                 result.records, result.partitions, result.seconds, result.rate)
        return result
    finally:
        await consumer.stop()


def write_batch(target: PartitionTarget, messages: list[Any]) -> int:
    """Apply changelog records to a partition's RocksDB, then advance its persisted offset."""
    if not messages:
        return 0
    batch = WriteBatch(raw_mode=True)
    for message in messages:
        if message.value is None:
            batch.delete(message.key)
        else:
            batch.put(message.key, message.value)
    target.db().write(batch)
    target.set_persisted_offset(messages[-1].offset)
    return len(messages)


class BulkRestoringRecovery(Recovery):
    """Faust's recovery service, bringing lagging partitions up to date in bulk first."""

    async def _build_offsets(self, consumer: ConsumerT, tps: set[TP], destination: Counter[TP], title: str) -> None:
        # Faust builds the actives' offsets right after their highwaters and before the
        # standbys' offsets: the one point where both sets are known and nothing reads yet.
        if title == "active":
            await self._bulk_restore()
        await super()._build_offsets(consumer, tps, destination, title)

    async def _bulk_restore(self) -> None:
        settings = _SETTINGS.get(cast(faust.App, self.app))
        if settings is None or not settings.bulk_restore:
            return
        targets: dict[TopicPartition, PartitionTarget] = {}
        limits: dict[TopicPartition, int] = {}
        for tp in sorted(self.active_tps | self.standby_tps):
            store = cast(Any, self.tp_to_table[tp]).data
            if not isinstance(store, RocksDBStore) or not _can_open(store, tp):
                continue
            active = tp in self.active_tps
            key = TopicPartition(tp.topic, tp.partition)
            targets[key] = _RecoveringPartition(store, tp, self.active_offsets if active else self.standby_offsets)
            if active:
                # Not past the highwater Faust just read: it checks offsets against it.
                limits[key] = self.active_highwaters[tp] + 1
        if targets:
            # Faust gives this step broker_request_timeout and stops recovering for good
            # when it runs out; what the budget leaves over, Faust's reader restores.
            budget_s = 0.6 * float(self.app.conf.broker_request_timeout)
            await restore_changelog(settings, targets, settings.bulk_restore_min_lag, limits=limits, budget_s=budget_s)


@dataclass
class _RecoveringPartition:
    store: RocksDBStore
    tp: TP
    #: Faust's recovery offsets (active or standby) for this partition, moved along with the store's
    offsets: Counter[TP]

    def db(self) -> Rdict:
        return store_partition_db(self.store, self.tp.partition)

    def persisted_offset(self) -> int | None:
        return self.store.persisted_offset(self.tp)

    def set_persisted_offset(self, offset: int) -> None:
        self.store.set_persisted_offset(self.tp, offset)
        self.offsets[self.tp] = offset


def _can_open(store: RocksDBStore, tp: TP) -> bool:
    """A standby's database is opened on first use and may be held by another worker on a shared data dir."""
    try:
        store_partition_db(store, tp.partition)
    except Exception as exc:  # rocksdict raises a plain Exception for a held lock
        log.info("not restoring %s in bulk: its database cannot be opened (%s)", tp, exc)
        return False
    return True


class BulkRestoringTableManager(TableManager):
    """Faust's table manager with :class:`BulkRestoringRecovery` as its recovery service."""

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = BulkRestoringRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery


def register_settings(app: faust.App, settings: Settings) -> None:
    """Give the stores of ``app`` the settings they restore with (Kafka connection, thresholds)."""
    _SETTINGS[app] = settings

