"""The few private Faust APIs the fleet relies on, wrapped in one place.

Faust does not expose a table partition's RocksDB handle, the map from changelog
partition to owning instance, or a way to say which event a table write belongs to.
Each of those is needed (range scans, query forwarding, batched processing); if a
Faust upgrade moves them, this is the only module to change.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import faust
from faust.streams import _current_event
from faust.types import TP
from rocksdict import Rdict


def partition_db(table: faust.Table, partition: int) -> Rdict:
    """The RocksDB database (rocksdict) holding one partition of a table."""
    return table.data._db_for_partition(partition)


def open_partitions(table: faust.Table) -> dict[int, Rdict]:
    """Partition → database for every partition this instance has opened (active or standby)."""
    return dict(table.data._dbs)


def active_partitions(app: faust.App, table: faust.Table) -> set[int]:
    """Changelog partitions of ``table`` this instance currently owns as active."""
    topic = table.changelog_topic.get_topic_name()
    return {tp.partition for tp in app.assignor.assigned_actives() if tp.topic == topic}


def partition_owner_url(app: faust.App, table: faust.Table, partition: int) -> str | None:
    """Canonical URL of the instance that owns ``partition`` of ``table`` as active, if known."""
    topic = table.changelog_topic.get_topic_name()
    url = app.assignor._tps_url.get(TP(topic, partition))
    return str(url).rstrip("/") if url else None


def all_owner_urls(app: faust.App, table: faust.Table) -> set[str]:
    """Every instance URL that owns at least one active partition of ``table``."""
    topic = table.changelog_topic.get_topic_name()
    return {str(url).rstrip("/") for tp, url in app.assignor._tps_url.items() if tp.topic == topic}


@contextmanager
def event_context(event: Any) -> Iterator[None]:
    """Make ``event`` the current event, so table writes go to its partition.

    Faust routes a table write to the partition of the event being processed. When a
    batch from ``stream.take()`` mixes partitions, each write must be made in the
    context of the event it belongs to.
    """
    token = _current_event.set(weakref.ref(event))
    try:
        yield
    finally:
        _current_event.reset(token)


def recovery_done(app: faust.App) -> bool:
    """True once table recovery after the last rebalance has finished."""
    recovery = app.tables.recovery
    return bool(recovery.completed.is_set()) and not recovery.in_recovery and not app.rebalancing
