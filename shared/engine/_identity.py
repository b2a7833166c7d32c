"""Which Kafka cluster and which incarnation of its changelog a partition's local state was built from.

A partition database on disk outlives the topics it was restored from: a data dir kept while
the Kafka cluster was rebuilt, or while the topics were deleted and created again under the
same names (a test environment reset), holds rows of topics that no longer exist. Faust's
recovery checks only that the local changelog offset is not past the changelog's end, so
such a copy was served as it was (its rows mixed with the new changelog's) when the new
changelog was longer, and crash-looped (``ConsistencyError``) when it was shorter.

So each partition database records, in its engine column family and never in a changelog,
the :class:`Incarnation` it belongs to: the cluster id (Metadata v2+) and the changelog
topic's id. A topic id (KIP-516) is drawn anew whenever a topic is created, so a topic
deleted and created again under its old name has another id, and so has any topic of
another cluster. aiokafka speaks Metadata only up to v5, which has the cluster id but not
the topic ids (v10+), so :class:`TopicIdMetadataRequest` adds Metadata v12 on aiokafka's
protocol types, sent through a plain client of its own.

Whenever a partition is assigned (active, standby or warm-up), before anything reads or
restores it, :func:`check_partition` compares what it recorded with what the brokers report:

* another cluster id, or another topic id: the local state is discarded;
* the changelog now ends before the local changelog offset (the same topic lost records, or
  nothing was recorded): discarded;
* no incarnation recorded (a database of an earlier version, or one whose recording was
  interrupted): the rows are compared with the changelog's last records up to the local
  offset (:func:`compare_with_changelog`); the state is adopted only when every key found
  there holds the same value locally, and discarded otherwise;
* else it is kept.

Discarding deletes every row of the partition (both column families) and its changelog
offset in one write batch, so the restore that follows reads the whole changelog; a warning
names the partition and what changed, and ``statefleet_local_state_discarded_total`` counts
it. A partition database that no recovery has checked in this process (a previous owner's,
still on disk) is not read from unless its recorded incarnation is the current one
(:func:`recorded_is_current`).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from io import BytesIO
from typing import Any, TypeAlias, cast

import rocksdict
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.abstract import AbstractType
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Boolean, CompactArray, CompactString, Int16, Int32, Schema, TaggedFields

from shared.engine._rocksdb import ENGINE_FAMILY, engine_family, is_engine_key, persisted_offset

log = logging.getLogger(__name__)

#: The engine-family row that records a partition database's :class:`Incarnation` (local only:
#: it is not a next-offset row, so no changelog carries it).
INCARNATION_KEY = b"\x00incarnation"

#: The cluster id when the brokers report none (Metadata below v2, never seen with Kafka 2.8+).
UNKNOWN = ""


# -- Metadata v12: topic ids ---------------------------------------------------------------


class Uuid(AbstractType[str]):  # type: ignore[misc]
    """Kafka's UUID: 16 bytes, shown as 32 hex digits (all zeros: none)."""

    @classmethod
    def encode(cls, value: str) -> bytes:
        return uuid.UUID(hex=value or "0" * 32).bytes

    @classmethod
    def decode(cls, data: BytesIO) -> str:
        raw = data.read(16)
        if len(raw) != 16:
            raise ValueError("Buffer underrun decoding a UUID")
        return raw.hex()


class MetadataResponse_v12(Response):  # type: ignore[misc]  # aiokafka's protocol classes are untyped
    API_KEY = 3
    API_VERSION = 12
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            CompactArray(
                ("node_id", Int32),
                ("host", CompactString("utf-8")),
                ("port", Int32),
                ("rack", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_id", CompactString("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            CompactArray(
                ("error_code", Int16),
                ("name", CompactString("utf-8")),
                ("topic_id", Uuid),
                ("is_internal", Boolean),
                (
                    "partitions",
                    CompactArray(
                        ("error_code", Int16),
                        ("partition_index", Int32),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("replica_nodes", CompactArray(Int32)),
                        ("isr_nodes", CompactArray(Int32)),
                        ("offline_replicas", CompactArray(Int32)),
                        ("tags", TaggedFields),
                    ),
                ),
                ("topic_authorized_operations", Int32),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class MetadataRequest_v12(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 3
    API_VERSION = 12
    RESPONSE_TYPE = MetadataResponse_v12
    SCHEMA = Schema(
        ("topics", CompactArray(("topic_id", Uuid), ("name", CompactString("utf-8")), ("tags", TaggedFields))),
        ("allow_auto_topic_creation", Boolean),
        ("include_topic_authorized_operations", Boolean),
        ("tags", TaggedFields),
    )


TopicIdMetadataStruct: TypeAlias = MetadataRequest_v12


class TopicIdMetadataRequest(Request[TopicIdMetadataStruct]):  # type: ignore[misc]
    """Metadata of some topics, with their ids (a broker older than Kafka 2.8 refuses it)."""

    API_KEY = 3

    def __init__(self, topics: Iterable[str]) -> None:
        self._topics = sorted(set(topics))

    def build(self, request_struct_class: type[TopicIdMetadataStruct]) -> TopicIdMetadataStruct:
        return request_struct_class([(UNKNOWN, name, {}) for name in self._topics], False, False, {})


@dataclass(frozen=True)
class Incarnation:
    """One topic as the brokers know it now: the cluster it lives in and its topic id."""

    cluster_id: str
    topic_id: str

    def encode(self) -> bytes:
        return json.dumps({"cluster_id": self.cluster_id, "topic_id": self.topic_id}, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Incarnation | None:
        try:
            data = json.loads(raw)
            return cls(str(data["cluster_id"]), str(data["topic_id"]))
        except (ValueError, KeyError, TypeError):
            return None  # unreadable: treated as not recorded (checked against the changelog)

    def differs(self, recorded: Incarnation) -> tuple[str, str] | None:
        """What changed since ``recorded``: (cause, description), or None when nothing did."""
        if recorded.cluster_id != self.cluster_id:
            return (
                CLUSTER_CHANGED,
                f"the Kafka cluster changed (cluster id {recorded.cluster_id or '?'} → {self.cluster_id or '?'})",
            )
        if recorded.topic_id != self.topic_id:
            return (
                TOPIC_RECREATED,
                f"the changelog topic was deleted and created again (topic id {recorded.topic_id} → {self.topic_id})",
            )
        return None


async def current_incarnations(client_kwargs: Mapping[str, Any], topics: Iterable[str]) -> dict[str, Incarnation]:
    """Each of ``topics`` that exists, with the cluster id and its topic id, as a broker reports them."""
    names = sorted(set(topics))
    if not names:
        return {}
    client = AIOKafkaClient(**client_kwargs)
    try:
        await client.bootstrap()
        node = client.get_random_node()
        response = await client.send(node, TopicIdMetadataRequest(names))
    finally:
        await client.close()
    cluster_id = response.cluster_id or UNKNOWN
    return {
        name: Incarnation(cluster_id, topic_id)
        for error_code, name, topic_id, *_ in response.topics
        if error_code == 0 and name is not None
    }


# -- the check -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChangelogNow:
    """A changelog partition as it is now: its incarnation, and its first and next offsets
    (committed records only)."""

    #: None: the brokers could not tell (offsets and rows are checked all the same)
    incarnation: Incarnation | None
    start: int
    end: int


#: Reads a changelog partition's committed records from ``low`` to ``high`` (inclusive):
#: (offset, key, value) in offset order.
ReadRange = Callable[[int, int], Awaitable[list[tuple[int, bytes, bytes | None]]]]

#: Changelog records compared first with a partition of an earlier layout, and most read.
COMPARE_WINDOW = 64
COMPARE_MAX = 64 * 16 * 16


#: Why local state was discarded (the ``cause`` label of ``statefleet_local_state_discarded_total``).
CLUSTER_CHANGED = "cluster_changed"
TOPIC_RECREATED = "topic_recreated"
CHANGELOG_SHORTER = "changelog_shorter"
NOT_IN_CHANGELOG = "not_in_changelog"
DISCARD_CAUSES = (CLUSTER_CHANGED, TOPIC_RECREATED, CHANGELOG_SHORTER, NOT_IN_CHANGELOG)


@dataclass(frozen=True)
class Verdict:
    """Whether a partition's local state is kept, and why not."""

    keep: bool
    reason: str | None = None
    #: One of :data:`DISCARD_CAUSES` when not kept.
    cause: str | None = None
    #: Why it was kept without a recorded incarnation (an earlier layout adopted).
    adopted: str | None = None


def recorded(db: rocksdict.Rdict) -> Incarnation | None:
    """The incarnation a partition database recorded, if any."""
    raw = engine_family(db).get(INCARNATION_KEY)
    return Incarnation.decode(cast(bytes, raw)) if raw is not None else None


def holds_state(db: rocksdict.Rdict) -> bool:
    """Whether a partition database holds anything: a changelog offset, or any row."""
    if persisted_offset(db) is not None or _edge_keys(db) is not None:
        return True
    edges = _edge_keys(engine_family(db))
    # A partition that recorded its incarnation and has had no record since is still empty.
    return edges is not None and edges != (INCARNATION_KEY, INCARNATION_KEY)


def _edge_keys(family: rocksdict.Rdict) -> tuple[bytes, bytes] | None:
    """A family's first and last keys, or None when it is empty."""
    it = family.iter()
    it.seek_to_first()
    if not it.valid():
        return None
    first = cast(bytes, it.key())
    it.seek_to_last()
    return first, cast(bytes, it.key())


async def check_partition(db: rocksdict.Rdict, now: ChangelogNow, read_range: ReadRange) -> Verdict:
    """Whether the local state of a partition may be kept (see the module's docstring)."""
    if not holds_state(db):
        return Verdict(True)
    mine = recorded(db)
    if mine is not None and now.incarnation is not None and (changed := now.incarnation.differs(mine)) is not None:
        return Verdict(False, changed[1], changed[0])  # the cause, whichever changelog is longer
    offset = persisted_offset(db)
    if offset is not None and offset + 1 > now.end:
        return Verdict(False, f"the changelog ends at offset {now.end}, before the local offset {offset + 1}", CHANGELOG_SHORTER)
    if mine is not None:
        return Verdict(True)
    if offset is None:
        return Verdict(False, "rows without a changelog offset", NOT_IN_CHANGELOG)
    return await compare_with_changelog(db, offset, now.start, read_range)


async def compare_with_changelog(db: rocksdict.Rdict, offset: int, start: int, read_range: ReadRange) -> Verdict:
    """A partition of an earlier layout (no incarnation recorded), up to changelog ``offset``:
    adopted when the changelog's last records up to that offset hold the local values.

    For each key among the records read, its last record at or before ``offset`` must hold
    what the database holds (a tombstone: no row). Any later record of that key up to
    ``offset`` is in the same window (compaction keeps a key's latest record), so that last
    record is the one the local state reflects. The window widens while it holds no record
    (a compacted or mostly aborted tail); a state with no record to compare is discarded."""
    window = COMPARE_WINDOW
    while True:
        low = max(start, offset - window + 1)
        records = await read_range(low, offset) if low <= offset else []
        if records or low == start or window >= COMPARE_MAX:
            break
        window *= 16
    if not records:
        return Verdict(False, f"no changelog record up to the local offset {offset} to compare it with", NOT_IN_CHANGELOG)
    last: dict[bytes, bytes | None] = {}
    for _, key, value in records:
        last[key] = value
    engine = engine_family(db)
    for key, value in last.items():
        local = (engine if is_engine_key(key) else db).get(key)
        if local != value:
            return Verdict(
                False, f"its rows differ from the changelog's (key {key[:40]!r}): built from another changelog", NOT_IN_CHANGELOG
            )
    return Verdict(True, adopted=f"its rows match the changelog's last {len(last)} keys up to offset {offset}")


def discard(db: rocksdict.Rdict) -> None:
    """Delete every row of a partition database, both families, and its changelog offset, in one
    write batch."""
    batch = rocksdict.WriteBatch(raw_mode=True)
    engine = db.get_column_family_handle(ENGINE_FAMILY)
    for family, handle in ((db, None), (engine_family(db), engine)):
        edges = _edge_keys(family)
        if edges is None:
            continue
        first, last = edges
        if handle is None:
            batch.delete_range(first, last)
            batch.delete(last)
        else:
            batch.delete_range(first, last, column_family=handle)
            batch.delete(last, column_family=handle)
    db.write(batch)


def record(db: rocksdict.Rdict, incarnation: Incarnation) -> None:
    """Record ``incarnation`` as the one the partition's state belongs to."""
    engine_family(db).put(INCARNATION_KEY, incarnation.encode())


def recorded_is_current(db: rocksdict.Rdict, current: Incarnation | None) -> bool:
    """Whether a database no recovery of this process checked (a previous owner's, on disk) may
    be read from: it recorded an incarnation, and it is ``current``."""
    if current is None:
        return False
    mine = recorded(db)
    return mine is not None and current.differs(mine) is None
