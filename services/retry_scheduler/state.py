"""How scheduled and parked messages are kept in RocksDB: the tables and their keys.

The values are encoded in :mod:`services.retry_scheduler.entries`; :mod:`services.retry_scheduler.scans`
reads the rows back in due order.

Tables (one RocksDB database per partition each; the partition of a message is the one
its ``dlq.id`` hashes to, so everything about one id lives in one place):

``schedule``  due key → entry. The due key is the due time as 8 bytes big-endian
              followed by the ``dlq.id`` (UTF-8), so RocksDB's byte order is due order
              and a scan from the first key reads the earliest due first. Due times are
              below 2**56, so the first byte is always 0x00 and every due key sorts
              before the table's other rows.
``index``     ``#`` + ``dlq.id`` → either the due key of its scheduled entry, or a *done
              marker*: the attempt that was redelivered, cancelled or replayed from the
              parking lot, and the key of the marker's expiry. The ``#`` keeps ids apart
              from due keys. A done marker also keeps the fingerprints of the dead-letter
              records taken in for the id: after the redelivery the same record read
              again (a crash made the scheduler read dead letters again that it had
              already redelivered) is dropped, and a new record of that attempt is a
              re-failure, stored as the next attempt (``docs/dead-letter-protocol.md``).
``expiry``    due key (expiry time, batch token) → JSON list of ids: when their done
              markers are forgotten (:data:`DONE_MEMORY_MS` after they were written).
              One row per tick rather than per id; ticks read it like the schedule.
``parked``    ``#`` + ``dlq.id`` → entry, for messages that used up their attempts.

The ``index`` also keeps one ``!counts`` row per partition: the partition's scheduled and
parked entries by (origin topic, error class) (:class:`Counts`), rewritten by every batch that
changes them, in the same write batch as the rows it counts and the input's offset. It goes
to the changelog with them, so a warm start, a restore, a standby and a rebalance all find
the counts that match the rows, without reading the rows.

A tick reads a partition from its *low-water key*: no live entry of the partition sorts
below it. Deleted entries leave tombstones in RocksDB until compaction drops them;
seeking past them rather than from the first key keeps a tick's cost proportional to
what is due, not to what was deleted before.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from services.retry_scheduler.domain import MAX_DUE_MS
from services.retry_scheduler.entries import classify

#: Keys of the ``index`` and ``parked`` tables start with this byte (never a due key's first).
ID_PREFIX = b"#"
DUE_WIDTH = 8
_DUE = struct.Struct(">Q")


class BadKey(ValueError):
    """A key that is not a due key, or a due time out of range."""


def due_key(due_at: int, dlq_id: str) -> bytes:
    """Sortable key: fixed-width big-endian due time, then the id."""
    if not 0 <= due_at <= MAX_DUE_MS:
        raise BadKey(f"due time {due_at} out of range")
    return _DUE.pack(due_at) + dlq_id.encode()


def id_key(dlq_id: str) -> bytes:
    """Key of an id in the ``index`` and ``parked`` tables."""
    return ID_PREFIX + dlq_id.encode()


def id_of(key: bytes) -> str:
    return key[len(ID_PREFIX) :].decode("utf-8", errors="replace")


# -- index values --------------------------------------------------------------------------------

DONE_REDELIVERED = b"D"
DONE_CANCELLED = b"C"
DONE_UNPARKED = b"U"
DONE_KINDS = {DONE_REDELIVERED: "redelivered", DONE_CANCELLED: "cancelled", DONE_UNPARKED: "replayed from the parking lot"}
#: How long the index remembers that an attempt was done (and drops copies of it).
DONE_MEMORY_MS = 3_600_000
_ATTEMPT = struct.Struct(">I")


#: A done marker that also keeps the fingerprints of the id's dead letters has its kind in lower
#: case, then the attempt, the number of fingerprints (1 byte), the fingerprints (8 bytes each),
#: then the expiry key. Markers written before fingerprints existed decode with none.
_WITH_FINGERPRINTS = {kind.lower(): kind for kind in DONE_KINDS}
FINGERPRINT_BYTES = 8


@dataclass(frozen=True, slots=True)
class Done:
    """An index marker: ``attempt`` of the id was redelivered, cancelled or unparked; the
    fingerprints (hex) of the dead letters taken in for it, so a copy is known as one."""

    kind: bytes
    attempt: int
    expiry_key: bytes
    fingerprints: tuple[str, ...] = ()

    @property
    def what(self) -> str:
        return DONE_KINDS.get(self.kind, "done")


def encode_done(kind: bytes, attempt: int, expiry_key: bytes, fingerprints: tuple[str, ...] = ()) -> bytes:
    packed_attempt = _ATTEMPT.pack(min(max(attempt, 0), (1 << 32) - 1))
    prints = [bytes.fromhex(f) for f in fingerprints if len(f) == 2 * FINGERPRINT_BYTES][-255:]
    if not prints:
        return kind + packed_attempt + expiry_key
    return kind.lower() + packed_attempt + bytes([len(prints)]) + b"".join(prints) + expiry_key


def decode_index(value: bytes) -> bytes | Done:
    """A due key (the id is scheduled under it) or a :class:`Done` marker."""
    kind = value[:1]
    if kind in DONE_KINDS:
        return Done(kind, _ATTEMPT.unpack_from(value, 1)[0], value[1 + _ATTEMPT.size :])
    if kind in _WITH_FINGERPRINTS:
        at = 1 + _ATTEMPT.size
        n = value[at]
        prints = value[at + 1 : at + 1 + n * FINGERPRINT_BYTES]
        fingerprints = tuple(prints[i : i + FINGERPRINT_BYTES].hex() for i in range(0, len(prints), FINGERPRINT_BYTES))
        rest = value[at + 1 + n * FINGERPRINT_BYTES :]
        return Done(_WITH_FINGERPRINTS[kind], _ATTEMPT.unpack_from(value, 1)[0], rest, fingerprints)
    return value


def due_prefix(due_at: int) -> bytes:
    """The smallest key with this due time: seek here to read everything due at or after it."""
    return _DUE.pack(min(max(due_at, 0), MAX_DUE_MS))


def is_due_key(key: bytes) -> bool:
    """A schedule or expiry key."""
    return len(key) > DUE_WIDTH and key[0] == 0


def split_due_key(key: bytes) -> tuple[int, str]:
    if not is_due_key(key):
        raise BadKey(f"not a due key: {key[:40]!r}")
    return _DUE.unpack_from(key)[0], key[DUE_WIDTH:].decode("utf-8", errors="replace")


def due_of(key: bytes) -> int:
    return int(_DUE.unpack_from(key)[0])


# -- history between attempts ----------------------------------------------------------------------

#: ``index`` rows that keep a message's history while it is between two attempts (sent to its
#: retry topic, not yet back as a dead letter): ``%`` + ``dlq.id``, apart from the ``#`` rows.
HISTORY_PREFIX = b"%"


def history_key(dlq_id: str) -> bytes:
    return HISTORY_PREFIX + dlq_id.encode()


# -- counts ----------------------------------------------------------------------------------------

#: The ``index`` row of a partition's counts, apart from the id (``#``), history (``%``) and
#: ordered-retry (``@``, ``^``) rows.
COUNTS_KEY = b"!counts"

CountsByKey = Counter[tuple[str, str]]


@dataclass
class CountChange:
    """What one batch changes in its partition's counts."""

    scheduled: CountsByKey = field(default_factory=Counter)
    parked: CountsByKey = field(default_factory=Counter)
    #: The key of each entry newly scheduled (:meth:`schedule`), counted into ``scheduled`` when
    #: the batch's counts are written (:meth:`settle`) and into the scheduled counter once
    #: committed: a batch schedules hundreds, listed faster than counted one by one.
    newly_scheduled: list[tuple[str, str]] = field(default_factory=list)

    def add(self, which: str, k: tuple[str, str], n: int = 1) -> None:
        (self.scheduled if which == "scheduled" else self.parked)[k] += n

    def schedule(self, k: tuple[str, str]) -> None:
        """One entry newly scheduled under ``k``."""
        self.newly_scheduled.append(k)

    def settle(self) -> None:
        """Count the entries newly scheduled into ``scheduled`` (once, before the batch's row is written)."""
        self.scheduled.update(self.newly_scheduled)

    def newly_scheduled_by_topic(self) -> Counter[str]:
        return Counter(topic for topic, _ in self.newly_scheduled)


def encode_counts(scheduled: CountsByKey, parked: CountsByKey) -> bytes:
    """The ``!counts`` row: ``{"s": [[origin topic, error class, n], …], "p": […]}``."""
    return orjson.dumps(
        {"s": [[t, c, n] for (t, c), n in scheduled.items() if n], "p": [[t, c, n] for (t, c), n in parked.items() if n]}
    )


def decode_counts(raw: bytes) -> tuple[CountsByKey, CountsByKey]:
    """(scheduled, parked) of a ``!counts`` row; raises ``ValueError`` on other bytes."""
    try:
        o = orjson.loads(raw)
        scheduled = Counter({(str(t), str(c)): int(n) for t, c, n in o["s"]})
        parked = Counter({(str(t), str(c)): int(n) for t, c, n in o["p"]})
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a counts row: {exc}") from exc
    return scheduled, parked


@dataclass
class Counts:
    """Scheduled entries by (origin topic, error class) and parked entries, per owned partition,
    as committed: each partition's ``!counts`` row (:data:`COUNTS_KEY`), loaded after every
    recovery, then changed by each batch once it is committed (:meth:`apply`).

    A partition without the row (its rows were written before the row existed) is counted from
    its rows instead (:meth:`rebuild`); its next batch that changes the counts writes the row.
    """

    scheduled: dict[int, CountsByKey] = field(default_factory=dict)
    parked: dict[int, CountsByKey] = field(default_factory=dict)

    def load(self, partition: int, raw: bytes) -> None:
        """A partition's counts from its ``!counts`` row."""
        self.scheduled[partition], self.parked[partition] = decode_counts(raw)

    def rebuild(
        self, schedule: dict[int, Iterable[tuple[bytes, bytes]]], parked: dict[int, Iterable[tuple[bytes, bytes]]]
    ) -> int:
        """These partitions' counts from their rows (each entry decoded); the rows read."""
        rows = 0
        for target, source in ((self.scheduled, schedule), (self.parked, parked)):
            for partition, items in source.items():
                counter: CountsByKey = Counter()
                for _key, raw in items:
                    try:
                        counter[classify(raw)] += 1
                    except (KeyError, TypeError, ValueError):
                        counter[("?", "?")] += 1
                    rows += 1
                target[partition] = counter
        return rows

    def forget(self, keep: Iterable[int]) -> None:
        """Drop the counts of partitions not in ``keep`` (no longer owned)."""
        owned = set(keep)
        for table in (self.scheduled, self.parked):
            for p in [p for p in table if p not in owned]:
                del table[p]

    def row_with(self, partition: int, change: CountChange) -> bytes:
        """The partition's ``!counts`` row once ``change`` is committed."""
        return encode_counts(
            self.scheduled.get(partition, Counter()) + change.scheduled, self.parked.get(partition, Counter()) + change.parked
        )

    def apply(self, partition: int, change: CountChange) -> None:
        """A committed batch's ``change``."""
        for table, delta in ((self.scheduled, change.scheduled), (self.parked, change.parked)):
            counter = table.setdefault(partition, Counter())
            for k, n in delta.items():
                counter[k] += n
                if counter[k] <= 0:
                    del counter[k]

    def totals(self, partitions: Iterable[int]) -> dict[str, Any]:
        owned = set(partitions)
        by_topic: Counter[str] = Counter()
        by_class: Counter[str] = Counter()
        parked_by_topic: Counter[str] = Counter()
        scheduled = parked = 0
        for p, counter in self.scheduled.items():
            if p not in owned:
                continue
            for (topic, cls), n in counter.items():
                by_topic[topic] += n
                by_class[cls] += n
                scheduled += n
        for p, counter in self.parked.items():
            if p not in owned:
                continue
            for (topic, _cls), n in counter.items():
                parked_by_topic[topic] += n
                parked += n
        return {
            "scheduled": scheduled,
            "parked": parked,
            "by_origin_topic": dict(by_topic),
            "by_error_class": dict(by_class),
            "parked_by_origin_topic": dict(parked_by_topic),
        }


# -- ordered retries: lanes and held records ---------------------------------------------------------

#: ``index`` rows of ordered retries (see :mod:`shared.ordered_retries`), apart from ``#`` and ``%``:
#: ``@`` + lane key → the lane (:class:`Lane`); ``^`` + lane key length + lane key + sequence
#: number → a held record (an encoded entry). A held record's id row (``#`` + ``dlq.id``) holds
#: its held key, which is neither a due key nor a done marker: the id is taken in, not scheduled.
LANE_PREFIX = b"@"
HELD_PREFIX = b"^"
_LANE_LENGTH = struct.Struct(">I")
_SEQUENCE = struct.Struct(">Q")


def lane_row_key(lane: bytes) -> bytes:
    return LANE_PREFIX + lane


def held_key(lane: bytes, sequence: int) -> bytes:
    """The length first, so that no lane's keys are a prefix of another's."""
    return HELD_PREFIX + _LANE_LENGTH.pack(len(lane)) + lane + _SEQUENCE.pack(sequence)


def is_held_key(value: bytes) -> bool:
    return value[:1] == HELD_PREFIX


@dataclass(frozen=True, slots=True)
class Lane:
    """A blocked (origin topic, key): its head's ``dlq.id``, and its held records, numbered
    ``next_held`` (the next to release) up to ``end_held`` (exclusive; the next to append).
    ``parking``: an operator's park-key is under way (it goes on in records of its own), so
    nothing is released meanwhile.

    ``head_partition`` and ``head_offset``: where the head was read on its origin topic (its
    letter's ``dlq.original.partition`` and ``dlq.original.offset``), published with the head
    so that a consumer re-reading that partition after a crash knows the records up to there
    are in hand (``docs/dead-letter-protocol.md``, "Ordered retries"). ``None`` in a row
    written before they were kept."""

    head: str
    next_held: int = 0
    end_held: int = 0
    parking: bool = False
    head_partition: int | None = None
    head_offset: int | None = None

    @property
    def held(self) -> int:
        return self.end_held - self.next_held


#: next_held, end_held, flags (:data:`_PARKING`, :data:`_HEAD_POSITION`); then, with
#: :data:`_HEAD_POSITION`, :data:`_LANE_POSITION`; then the head's id. A row of before the
#: position was kept has a flags byte of 0 or 1 (it was the ``parking`` bool): read alike.
_LANE_HEAD = struct.Struct(">QQB")
_LANE_POSITION = struct.Struct(">qq")
_PARKING = 0x01
_HEAD_POSITION = 0x02


def encode_lane(lane: Lane) -> bytes:
    flags = _PARKING if lane.parking else 0
    position = b""
    if lane.head_partition is not None and lane.head_offset is not None:
        flags |= _HEAD_POSITION
        position = _LANE_POSITION.pack(lane.head_partition, lane.head_offset)
    return _LANE_HEAD.pack(lane.next_held, lane.end_held, flags) + position + lane.head.encode()


def decode_lane(raw: bytes) -> Lane:
    if len(raw) < _LANE_HEAD.size:
        raise ValueError(f"not a lane: {raw[:40]!r}")
    next_held, end_held, flags = _LANE_HEAD.unpack_from(raw)
    at = _LANE_HEAD.size
    partition = offset = None
    if flags & _HEAD_POSITION:
        if len(raw) < at + _LANE_POSITION.size:
            raise ValueError(f"not a lane: {raw[:40]!r}")
        partition, offset = _LANE_POSITION.unpack_from(raw, at)
        at += _LANE_POSITION.size
    return Lane(raw[at:].decode(), next_held, end_held, bool(flags & _PARKING), partition, offset)
