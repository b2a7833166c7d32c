"""The few private Faust APIs the fleet relies on, wrapped in one place.

Faust does not expose a table partition's RocksDB handle, the map from changelog
partition to owning instance, or its consumer's group coordinator. Each is needed
(range scans, query forwarding, group membership); if a
Faust upgrade moves them, this is the only module to change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator
from typing import Any, TextIO, cast

import faust
from faust.types import TP, TableT
from rocksdict import Rdict

log = logging.getLogger(__name__)

AnyTable = TableT[Any, Any]

#: A topic partition as Faust names it (topic, partition).
TopicPartition = TP

#: Faust keeps each partition's committed offset under this key (in the partition database's
#: engine family, see :mod:`shared.engine._rocksdb`).
FAUST_OFFSET_KEY = b"__faust\x00offset__"


def partition_db(table: AnyTable, partition: int) -> Rdict:
    """The RocksDB database (rocksdict) holding one partition of a table."""
    return store_partition_db(cast(Any, table).data, partition)


def store_partition_db(store: Any, partition: int) -> Rdict:
    """The RocksDB database (rocksdict) of one partition of a table's RocksDB store (opened if need be)."""
    return cast(Rdict, store._db_for_partition(partition))


def partition_items(
    table: AnyTable, partition: int, from_key: bytes | None = None, backwards: bool = False
) -> Iterator[tuple[bytes, bytes]]:
    """A partition's rows (its default column family: the service's rows) in key order (or
    reverse), from ``from_key``."""
    db = partition_db(table, partition)
    items = db.items(from_key=from_key, backwards=backwards) if from_key is not None else db.items(backwards=backwards)
    for key, value in items:
        yield cast(bytes, key), cast(bytes, value)


def active_partitions(app: faust.App, table: AnyTable) -> set[int]:
    """Changelog partitions of ``table`` this instance currently owns as active."""
    topic = table.changelog_topic.get_topic_name()
    return {tp.partition for tp in app.assignor.assigned_actives() if tp.topic == topic}


def _tps_url(app: faust.App) -> dict[TP, str]:
    return cast(dict[TP, str], cast(Any, app.assignor)._tps_url)


def partition_owner_url(app: faust.App, table: AnyTable, partition: int) -> str | None:
    """Canonical URL of the instance that owns ``partition`` of ``table`` as active, if known."""
    topic = table.changelog_topic.get_topic_name()
    url = _tps_url(app).get(TP(topic, partition))
    return str(url).rstrip("/") if url else None


def all_owner_urls(app: faust.App, table: AnyTable) -> set[str]:
    """Every instance URL that owns at least one active partition of ``table``."""
    topic = table.changelog_topic.get_topic_name()
    return {str(url).rstrip("/") for tp, url in _tps_url(app).items() if tp.topic == topic}


def recovery_done(app: faust.App) -> bool:
    """True once table recovery after the last rebalance has finished."""
    recovery = cast(Any, app.tables).recovery
    return bool(recovery.completed.is_set()) and not recovery.in_recovery and not app.rebalancing


def tps_with_unacked_messages(app: faust.App) -> set[TP]:
    """The partitions with a record handed to a stream and not yet acknowledged by its stream."""
    return {message.tp for message in list(cast(Any, app.consumer)._unacked_messages)}


# -- Fleet view (GET /instance): what this instance owns and how far behind it is -------------------


#: A topic partition as the fleet view gives it: (topic, partition), a plain tuple.
Partition = tuple[str, int]


def assigned_partitions(app: faust.App) -> tuple[set[Partition], set[Partition]]:
    """(active, standby) topic partitions Faust's assignor gave this instance at the last rebalance."""
    assignor = cast(Any, app.assignor)
    return _plain(assignor.assigned_actives()), _plain(assignor.assigned_standbys())


def _plain(tps: Iterable[TP]) -> set[Partition]:
    return {(tp.topic, tp.partition) for tp in tps}


def changelog_topics(app: faust.App) -> set[str]:
    """The changelog topic of every table of ``app``."""
    return {table.changelog_topic.get_topic_name() for table in app.tables.values()}


def known_instance_urls(app: faust.App) -> set[str]:
    """Canonical URLs of every instance the last assignment gave changelog partitions to."""
    distribution = cast(Any, app.assignor).changelog_distribution or {}
    return {str(url).rstrip("/") for url in distribution}


def input_lag(app: faust.App, tps: set[Partition]) -> dict[Partition, int | None]:
    """Records of each partition not yet committed: the consumer's last seen high watermark
    minus its committed offset (None until the consumer has fetched from the partition).

    Reads what the consumer already knows; it asks the broker nothing. Faust keeps a
    committed offset of 0 as None, so None counts as 0.
    """
    consumer = cast(Any, app.consumer)
    committed: dict[TP, int | None] = consumer._committed_offset
    out: dict[Partition, int | None] = {}
    for topic, partition in tps:
        tp = TP(topic, partition)
        try:
            highwater = consumer.highwater(tp)
        except Exception:  # not started, or the partition was just revoked
            highwater = None
        out[(topic, partition)] = None if highwater is None else max(0, int(highwater) - int(committed.get(tp) or 0))
    return out


def member_urls(app: faust.App) -> set[str]:
    """Canonical URLs of every instance the last assignment gave active partitions to, of tables
    or of other topics (the assignor publishes both maps to every member)."""
    assignor = cast(Any, app.assignor)
    distributions = (assignor.changelog_distribution or {}, assignor.external_topic_distribution or {})
    return {str(url).rstrip("/") for distribution in distributions for url in distribution}


def consumer_coordinator(app: faust.App) -> Any | None:
    """The worker consumer's aiokafka group coordinator, which lives on the consumer thread's
    loop (None before the consumer has started)."""
    try:
        return cast(Any, app.consumer)._thread._ensure_consumer()._coordinator
    except Exception as exc:  # not started, or stopping
        log.debug("no group coordinator: %r", exc)
        return None


def request_rejoin(app: faust.App) -> bool:
    """Have the worker's consumer rejoin its group now (False if it has not started).

    aiokafka's group coordinator runs on the consumer thread's loop, so the request is
    handed to that loop."""
    coordinator = consumer_coordinator(app)
    if coordinator is None:
        return False
    try:
        cast(Any, app.consumer)._thread.thread_loop.call_soon_threadsafe(coordinator.request_rejoin)
    except Exception as exc:  # stopping
        log.debug("no rejoin: %r", exc)
        return False
    return True


def print_thread_loop_tasks(app: faust.App, file: TextIO) -> None:
    """Write the stack of every task on the consumer thread's event loop (aiokafka's group
    coordinator, its fetcher, and the calls Faust hands to that thread) to ``file``."""
    try:
        loop = cast(Any, app.consumer)._thread.thread_loop
    except Exception as exc:  # not started
        print(f"no consumer thread loop: {exc!r}", file=file)
        return
    for attempt in range(3):  # the set of tasks may change while it is read from this thread
        try:
            tasks = list(asyncio.all_tasks(loop))
            break
        except RuntimeError:
            if attempt == 2:
                print("the consumer thread's tasks could not be listed", file=file)
                return
    print(f"CONSUMER THREAD LOOP: {len(tasks)} TASKS", file=file)
    for task in tasks:
        print(f"  TASK {task!r}", file=file)
        task.print_stack(file=file)
    file.flush()
