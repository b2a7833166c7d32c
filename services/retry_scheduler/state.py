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


# -- in-memory counts ----------------------------------------------------------------------------


@dataclass
class Counts:
    """Scheduled entries by (origin topic, error class) and parked entries, per owned partition.

    Derived from the tables: rebuilt after every recovery, then kept up to date as the
    handler schedules, redelivers, cancels and parks.
    """

    scheduled: dict[int, Counter[tuple[str, str]]] = field(default_factory=dict)
    parked: dict[int, Counter[tuple[str, str]]] = field(default_factory=dict)

    def rebuild(
        self, schedule: dict[int, Iterable[tuple[bytes, bytes]]], parked: dict[int, Iterable[tuple[bytes, bytes]]]
    ) -> int:
        rows = 0
        fresh_s: dict[int, Counter[tuple[str, str]]] = {}
        fresh_p: dict[int, Counter[tuple[str, str]]] = {}
        for target, source in ((fresh_s, schedule), (fresh_p, parked)):
            for partition, items in source.items():
                counter: Counter[tuple[str, str]] = Counter()
                for _key, raw in items:
                    try:
                        counter[classify(raw)] += 1
                    except (KeyError, TypeError, ValueError):
                        counter[("?", "?")] += 1
                    rows += 1
                target[partition] = counter
        self.scheduled, self.parked = fresh_s, fresh_p
        return rows

    def add(self, which: str, partition: int, k: tuple[str, str], n: int = 1) -> None:
        """Count ``n`` more (or fewer) entries under ``k`` (:attr:`Entry.counted_as`)."""
        table = self.scheduled if which == "scheduled" else self.parked
        counter = table.setdefault(partition, Counter())
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
