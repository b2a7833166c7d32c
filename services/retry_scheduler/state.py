"""How scheduled and parked messages are kept in RocksDB, and read back in due order.

Tables (one RocksDB database per partition each; the partition of a message is the one
its ``dlq.id`` hashes to, so everything about one id lives in one place):

``schedule``  due key → entry. The due key is the due time as 8 bytes big-endian
              followed by the ``dlq.id`` (UTF-8), so RocksDB's byte order is due order
              and a scan from the first key reads the earliest due first. Due times are
              below 2**56, so the first byte is always 0x00 and every due key sorts
              before Faust's own offset key (``b"__faust\\x00offset__"``, 0x5f…).
``index``     ``#`` + ``dlq.id`` → either the due key of its scheduled entry, or a *done
              marker*: the attempt that was redelivered, cancelled or replayed from the
              parking lot, and the key of the marker's expiry. The ``#`` keeps ids apart
              from Faust's offset key. A dead letter that arrives again with an attempt
              the index says is scheduled or done is a duplicate and is dropped; the
              marker makes this hold after the redelivery too, e.g. when a crash makes
              the scheduler read dead letters again that it had already redelivered.
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
from binascii import a2b_base64, b2a_base64
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import orjson

from services.retry_scheduler.domain import MAX_DUE_MS, merge_headers
from shared.dead_letters import DLQ_PREFIX, DeadLetter
from shared.engine import is_next_offset_key

#: Faust keeps each partition's committed changelog offset under this key in the same database.
FAUST_OFFSET_KEY = b"__faust\x00offset__"
#: Keys of the ``index`` and ``parked`` tables start with this byte, so no id can collide
#: with Faust's offset key.
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
    return key[len(ID_PREFIX):].decode("utf-8", errors="replace")


# -- index values --------------------------------------------------------------------------------

DONE_REDELIVERED = b"D"
DONE_CANCELLED = b"C"
DONE_UNPARKED = b"U"
DONE_KINDS = {DONE_REDELIVERED: "redelivered", DONE_CANCELLED: "cancelled", DONE_UNPARKED: "replayed from the parking lot"}
#: How long the index remembers that an attempt was done (and drops copies of it).
DONE_MEMORY_MS = 3_600_000
_ATTEMPT = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class Done:
    """An index marker: ``attempt`` of the id was redelivered, cancelled or unparked."""

    kind: bytes
    attempt: int
    expiry_key: bytes

    @property
    def what(self) -> str:
        return DONE_KINDS.get(self.kind, "done")


def encode_done(kind: bytes, attempt: int, expiry_key: bytes) -> bytes:
    return kind + _ATTEMPT.pack(min(max(attempt, 0), (1 << 32) - 1)) + expiry_key


def decode_index(value: bytes) -> bytes | Done:
    """A due key (the id is scheduled under it) or a :class:`Done` marker."""
    if value[:1] in DONE_KINDS:
        return Done(value[:1], _ATTEMPT.unpack_from(value, 1)[0], value[1 + _ATTEMPT.size:])
    return value


def due_prefix(due_at: int) -> bytes:
    """The smallest key with this due time: seek here to read everything due at or after it."""
    return _DUE.pack(min(max(due_at, 0), MAX_DUE_MS))


def is_due_key(key: bytes) -> bool:
    """A schedule or expiry key; not Faust's offset row nor a handler's next-offset row (the
    tables the inbox handler writes each keep a copy of its next offsets)."""
    return len(key) > DUE_WIDTH and key[0] == 0 and key != FAUST_OFFSET_KEY and not is_next_offset_key(key)


def split_due_key(key: bytes) -> tuple[int, str]:
    if not is_due_key(key):
        raise BadKey(f"not a due key: {key[:40]!r}")
    return _DUE.unpack_from(key)[0], key[DUE_WIDTH:].decode("utf-8", errors="replace")


def due_of(key: bytes) -> int:
    return int(_DUE.unpack_from(key)[0])


# -- entries ---------------------------------------------------------------------------------------

#: Most history events one entry keeps (the latest).
HISTORY_KEPT = 50


@dataclass(frozen=True, slots=True)
class Replayed:
    """An operator's action on a message: when, which action, and the attempt it acted on."""

    at: int
    action: str
    attempt: int

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at, "action": self.action, "attempt": self.attempt}


# binascii directly: base64's wrappers cost more than the encoding, a dozen times per entry.
def _b64(data: bytes | None) -> str | None:
    return None if data is None else b2a_base64(data, newline=False).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else a2b_base64(text)


@dataclass(frozen=True, slots=True)
class Entry:
    """A dead letter as stored: what to redeliver, where, and why it failed."""

    id: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    retry_topic: str
    attempt: int
    origin_topic: str
    origin_partition: int
    origin_offset: int
    error_class: str
    error_message: str
    first_failed_at: int
    failed_at: int
    received_at: int
    due_at: int = 0
    max_attempts: int = 0
    parked_at: int | None = None
    parked_reason: str | None = None
    #: What operators did to it, oldest first (:class:`Replayed`); carried to its later attempts.
    history: tuple[Replayed, ...] = ()

    def scheduled(self, due_at: int, max_attempts: int) -> Entry:
        # Spelled out rather than dataclasses.replace, which costs several times more (once per dead letter).
        return Entry(
            self.id, self.key, self.value, self.headers, self.retry_topic, self.attempt, self.origin_topic,
            self.origin_partition, self.origin_offset, self.error_class, self.error_message, self.first_failed_at,
            self.failed_at, self.received_at, due_at, max_attempts, self.parked_at, self.parked_reason, self.history,
        )

    def parked(self, at: int, reason: str, max_attempts: int) -> Entry:
        return replace(self, parked_at=at, parked_reason=reason, max_attempts=max_attempts)

    def with_history(self, *events: Replayed) -> Entry:
        """This entry with ``events`` added to its history (at most :data:`HISTORY_KEPT`, the latest)."""
        return replace(self, history=(*self.history, *events)[-HISTORY_KEPT:])

    @property
    def counted_as(self) -> tuple[str, str]:
        """The key it is counted under (:class:`Counts`): origin topic and error class."""
        return (self.origin_topic, self.error_class)

    def parking_headers(self) -> list[tuple[str, bytes]]:
        """Every header it was redelivered with, plus when and why it was parked."""
        extra = [
            ("dlq.parked.at", str(self.parked_at or 0).encode()),
            ("dlq.parked.reason", (self.parked_reason or "").encode()),
        ]
        return list(self.headers) + extra


_INT64 = (-(1 << 63), (1 << 63) - 1)
_MAX_ATTEMPT = (1 << 31) - 1


def _clamp(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, n))


def entry_from_letter(letter: DeadLetter, raw_headers: list[tuple[str, bytes]], received_at: int) -> Entry:
    """The entry for a dead letter: its headers as received, with every ``dlq.*`` header filled in.

    Numbers read from headers are clamped to what is stored (the headers themselves are
    redelivered as they came).
    """
    dlq_headers = [(k, v) for k, v in letter.headers() if k.startswith(DLQ_PREFIX)]
    return Entry(
        id=letter.id, key=letter.key, value=letter.value,
        headers=tuple(merge_headers(raw_headers, dlq_headers)),
        retry_topic=letter.retry_topic, attempt=_clamp(letter.attempt, 1, _MAX_ATTEMPT),
        origin_topic=letter.original_topic, origin_partition=_clamp(letter.original_partition, *_INT64),
        origin_offset=_clamp(letter.original_offset, *_INT64),
        error_class=letter.error_class, error_message=letter.error_message,
        first_failed_at=_clamp(letter.first_failed_at, 0, MAX_DUE_MS),
        failed_at=_clamp(letter.failed_at, 0, MAX_DUE_MS), received_at=received_at,
    )


def encode_entry(e: Entry) -> bytes:
    fields: dict[str, Any] = {
        "id": e.id, "k": _b64(e.key), "v": _b64(e.value),
        "h": [[name, _b64(value)] for name, value in e.headers],
        "rt": e.retry_topic, "a": e.attempt,
        "ot": e.origin_topic, "op": e.origin_partition, "oo": e.origin_offset,
        "ec": e.error_class, "em": e.error_message,
        "ff": e.first_failed_at, "fa": e.failed_at, "ra": e.received_at,
        "due": e.due_at, "ma": e.max_attempts, "pa": e.parked_at, "pr": e.parked_reason,
    }
    if e.history:  # absent when empty: entries stored before history existed decode alike
        fields["hi"] = _history_json(e.history)
    return orjson.dumps(fields)


def _history_json(history: Iterable[Replayed]) -> list[list[Any]]:
    return [[h.at, h.action, h.attempt] for h in history]


def _history_of(raw: Any) -> tuple[Replayed, ...]:
    return tuple(Replayed(int(at), str(action), int(attempt)) for at, action, attempt in raw or ())


def decode_entry(raw: bytes) -> Entry:
    """Raises ``ValueError`` (or a subclass) on bytes that are not an encoded entry."""
    try:
        o = orjson.loads(raw)
        return Entry(
            id=o["id"], key=_unb64(o["k"]), value=_unb64(o["v"]),
            headers=tuple((name, _unb64(value) or b"") for name, value in o["h"]),
            retry_topic=o["rt"], attempt=o["a"],
            origin_topic=o["ot"], origin_partition=o["op"], origin_offset=o["oo"],
            error_class=o["ec"], error_message=o["em"],
            first_failed_at=o["ff"], failed_at=o["fa"], received_at=o["ra"],
            due_at=o["due"], max_attempts=o["ma"], parked_at=o["pa"], parked_reason=o["pr"],
            history=_history_of(o["hi"]) if "hi" in o else (),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not an encoded entry: {exc}") from exc


# -- decided dead letters (the inbox's letters) -----------------------------------------------------

#: Parked flag, attempt, due time, then the byte lengths of the id, origin topic and error class.
_DECIDED_HEAD = struct.Struct(">BIQIII")


@dataclass(frozen=True, slots=True)
class Decided:
    """A dead letter with its fate decided: the entry to store, already encoded, and the few
    fields the inbox needs to store it without decoding it."""

    id: str
    parked: bool
    attempt: int
    due_at: int
    counted_as: tuple[str, str]
    stored: bytes  # encode_entry of the scheduled or parked entry

    @classmethod
    def of(cls, entry: Entry) -> Decided:
        """A scheduled or parked entry (see :meth:`Entry.scheduled`, :meth:`Entry.parked`)."""
        return cls(entry.id, entry.parked_at is not None, entry.attempt, entry.due_at, entry.counted_as,
                   encode_entry(entry))


def encode_decided(d: Decided) -> bytes:
    """A fixed head, the id and the counting key, then the stored bytes unchanged."""
    dlq_id, topic, error_class = d.id.encode(), d.counted_as[0].encode(), d.counted_as[1].encode()
    head = _DECIDED_HEAD.pack(d.parked, d.attempt, d.due_at, len(dlq_id), len(topic), len(error_class))
    return b"".join((head, dlq_id, topic, error_class, d.stored))


def decode_decided(raw: bytes) -> Decided:
    """Raises ``ValueError`` (or a subclass) on bytes :func:`encode_decided` did not make."""
    try:
        parked, attempt, due_at, id_len, topic_len, class_len = _DECIDED_HEAD.unpack_from(raw)
    except struct.error as exc:
        raise ValueError(f"not a decided dead letter: {exc}") from exc
    at = _DECIDED_HEAD.size
    fields = []
    for n in (id_len, topic_len, class_len):
        fields.append(raw[at:at + n].decode())
        at += n
    if len(raw) <= at:
        raise ValueError("not a decided dead letter: truncated")
    return Decided(fields[0], bool(parked), attempt, due_at, (fields[1], fields[2]), raw[at:])


def classify(raw: bytes) -> tuple[str, str]:
    """(origin topic, error class) of an encoded entry, for the in-memory counts."""
    o = orjson.loads(raw)
    return str(o["ot"]), str(o["ec"])


# -- scans -----------------------------------------------------------------------------------------


class _Iter(Protocol):
    def seek(self, key: bytes) -> None: ...
    def valid(self) -> bool: ...
    def key(self) -> Any: ...
    def value(self) -> Any: ...
    def next(self) -> None: ...


class SortedDb(Protocol):
    """What the scans need from a partition's database (a rocksdict ``Rdict`` in raw mode)."""

    def iter(self) -> _Iter: ...


@dataclass
class DueScan:
    """The entries due in one partition, in due order, and where the next scan may start."""

    items: list[tuple[bytes, bytes]]
    examined: int
    more_due: bool  # stopped at the limit with more entries already due


def scan_due(db: SortedDb, now_ms: int, limit: int, start: bytes = b"") -> DueScan:
    """Read up to ``limit`` entries with due time <= ``now_ms``, from ``start`` on.

    Seeks once and reads only due entries plus the one that ends the scan: the cost is
    that of the due entries, whatever the number stored after them.
    """
    it = db.iter()
    it.seek(start)
    items: list[tuple[bytes, bytes]] = []
    examined = 0
    while it.valid():
        key = bytes(it.key())
        if not is_due_key(key):
            break  # past the due keys (Faust's offset key or foreign keys sort after them)
        examined += 1
        if due_of(key) > now_ms:
            break
        if len(items) >= limit:
            return DueScan(items, examined, more_due=True)
        items.append((key, bytes(it.value())))
        it.next()
    return DueScan(items, examined, more_due=False)


def first_due_key(db: SortedDb, start: bytes = b"") -> bytes | None:
    it = db.iter()
    it.seek(start)
    if it.valid():
        key = bytes(it.key())
        if is_due_key(key):
            return key
    return None


@dataclass
class PageScan:
    items: list[tuple[bytes, bytes]]
    exhausted: bool  # no further matching entry in this partition
    frontier: bytes | None  # when the budget ran out: every key up to here was examined


def _scan(
    db: SortedDb,
    *,
    seek: bytes,
    in_range: Callable[[bytes], bool],
    after: bytes | None,
    limit: int,
    origin_topic: str | None,
    budget: int,
) -> PageScan:
    """Rows from ``seek`` while ``in_range`` holds, after ``after`` (exclusive), optionally
    filtered by origin topic, examining at most ``budget`` rows."""
    it = db.iter()
    it.seek(seek)
    items: list[tuple[bytes, bytes]] = []
    examined = 0
    last: bytes | None = None
    while it.valid():
        key = bytes(it.key())
        if not in_range(key):
            break
        if after is not None and key <= after:
            it.next()
            continue
        if examined >= budget:
            return PageScan(items, exhausted=False, frontier=last)
        examined += 1
        last = key
        raw = bytes(it.value())
        if origin_topic is None or classify(raw)[0] == origin_topic:
            items.append((key, raw))
            if len(items) >= limit:
                return PageScan(items, exhausted=False, frontier=None)
        it.next()
    return PageScan(items, exhausted=True, frontier=None)


def scan_page(
    db: SortedDb,
    *,
    after: bytes | None,
    limit: int,
    due_before: int | None,
    origin_topic: str | None,
    budget: int,
    start: bytes = b"",
) -> PageScan:
    """Entries in due order after ``after`` (exclusive), optionally filtered, examining at most ``budget``."""

    def in_range(key: bytes) -> bool:
        return is_due_key(key) and (due_before is None or due_of(key) < due_before)

    seek = max(after, start) if after is not None else start
    return _scan(db, seek=seek, in_range=in_range, after=after, limit=limit, origin_topic=origin_topic, budget=budget)


def scan_ids(
    db: SortedDb,
    *,
    after: bytes | None,
    limit: int,
    origin_topic: str | None,
    budget: int,
) -> PageScan:
    """Rows of an id-keyed table (``parked``) in id order after ``after`` (exclusive)."""
    return _scan(
        db, seek=after if after is not None else ID_PREFIX, in_range=lambda key: key.startswith(ID_PREFIX),
        after=after, limit=limit, origin_topic=origin_topic, budget=budget,
    )


# -- parked groups -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupFilter:
    """Which parked messages a group view or a group action covers: an origin topic, an
    error class, and when they were parked (``parked_from <= parked_at <= parked_to``)."""

    origin_topic: str | None = None
    error_class: str | None = None
    parked_from: int | None = None
    parked_to: int | None = None

    def matches(self, o: dict[str, Any]) -> bool:
        """Whether a decoded stored entry (the JSON object) is covered."""
        if self.origin_topic is not None and o["ot"] != self.origin_topic:
            return False
        if self.error_class is not None and o["ec"] != self.error_class:
            return False
        parked_at = o.get("pa") or 0
        if self.parked_from is not None and parked_at < self.parked_from:
            return False
        return self.parked_to is None or parked_at <= self.parked_to

    def to_json(self) -> dict[str, Any]:
        return {"ot": self.origin_topic, "ec": self.error_class, "from": self.parked_from, "to": self.parked_to}

    @classmethod
    def from_json(cls, o: dict[str, Any]) -> GroupFilter:
        return cls(o.get("ot"), o.get("ec"), o.get("from"), o.get("to"))


@dataclass
class ParkedGroup:
    """Parked messages of one (origin topic, error class), and the newest one's error."""

    origin_topic: str
    error_class: str
    count: int = 0
    oldest_parked_at: int | None = None
    newest_parked_at: int | None = None
    newest_error_message: str = ""

    def add(self, parked_at: int, error_message: str) -> None:
        self.count += 1
        if self.oldest_parked_at is None or parked_at < self.oldest_parked_at:
            self.oldest_parked_at = parked_at
        if self.newest_parked_at is None or parked_at >= self.newest_parked_at:
            self.newest_parked_at = parked_at
            self.newest_error_message = error_message

    def merge(self, other: ParkedGroup) -> None:
        self.count += other.count
        if other.oldest_parked_at is not None:
            self.oldest_parked_at = min(other.oldest_parked_at, self.oldest_parked_at or other.oldest_parked_at)
        if other.newest_parked_at is not None and (
            self.newest_parked_at is None or other.newest_parked_at >= self.newest_parked_at
        ):
            self.newest_parked_at = other.newest_parked_at
            self.newest_error_message = other.newest_error_message

    def to_json(self) -> dict[str, Any]:
        return {
            "origin_topic": self.origin_topic, "error_class": self.error_class, "count": self.count,
            "oldest_parked_at": self.oldest_parked_at, "newest_parked_at": self.newest_parked_at,
            "newest_error_message": self.newest_error_message,
        }

    @classmethod
    def from_json(cls, o: dict[str, Any]) -> ParkedGroup:
        return cls(
            str(o["origin_topic"]), str(o["error_class"]), int(o["count"]), o.get("oldest_parked_at"),
            o.get("newest_parked_at"), str(o.get("newest_error_message") or ""),
        )


@dataclass
class GroupScan:
    groups: list[ParkedGroup]
    resume: bytes | None  # where to go on when the budget ran out; None: every row was examined


def _parked_rows(db: SortedDb, after: bytes | None) -> Iterator[tuple[bytes, bytes]]:
    """The rows of an id-keyed table (``parked``) in id order, after ``after`` (exclusive)."""
    it = db.iter()
    it.seek(after if after is not None else ID_PREFIX)
    while it.valid():
        key = bytes(it.key())
        if not key.startswith(ID_PREFIX):
            return
        if after is None or key > after:
            yield key, bytes(it.value())
        it.next()


def scan_parked_groups(db: SortedDb, flt: GroupFilter, budget: int, after: bytes | None = None) -> GroupScan:
    """The parked rows ``flt`` covers after ``after``, grouped by (origin topic, error class),
    examining at most ``budget`` rows."""
    groups: dict[tuple[str, str], ParkedGroup] = {}
    last: bytes | None = None
    for examined, (key, raw) in enumerate(_parked_rows(db, after)):
        if examined >= budget:
            return GroupScan(list(groups.values()), resume=last)
        last = key
        o = orjson.loads(raw)
        if flt.matches(o):
            k = (str(o["ot"]), str(o["ec"]))
            group = groups.get(k)
            if group is None:
                group = groups[k] = ParkedGroup(*k)
            group.add(int(o.get("pa") or 0), str(o["em"]))
    return GroupScan(list(groups.values()), resume=None)


def scan_parked_matching(
    db: SortedDb, flt: GroupFilter, *, after: bytes | None, limit: int | None, budget: int,
) -> tuple[list[tuple[bytes, bytes, dict[str, Any]]], bytes | None]:
    """Parked rows ``flt`` covers, in id order after ``after`` (exclusive), as (key, stored
    bytes, the stored JSON object): at most ``limit`` of them, examining at most ``budget``
    rows. Also the key to go on after, or ``None`` when the partition has no further row."""
    found: list[tuple[bytes, bytes, dict[str, Any]]] = []
    last: bytes | None = None
    for examined, (key, raw) in enumerate(_parked_rows(db, after)):
        if examined >= budget or (limit is not None and len(found) >= limit):
            return found, last
        last = key
        o = orjson.loads(raw)
        if flt.matches(o):
            found.append((key, raw, o))
    return found, None


# -- history between attempts ----------------------------------------------------------------------

#: ``index`` rows that keep a message's history while it is between two attempts (sent to its
#: retry topic, not yet back as a dead letter): ``%`` + ``dlq.id``, apart from the ``#`` rows.
HISTORY_PREFIX = b"%"


def history_key(dlq_id: str) -> bytes:
    return HISTORY_PREFIX + dlq_id.encode()


def encode_history(history: Iterable[Replayed]) -> bytes:
    return orjson.dumps(_history_json(history))


def decode_history(raw: bytes) -> tuple[Replayed, ...]:
    """Raises ``ValueError`` (or a subclass) on bytes :func:`encode_history` did not make."""
    try:
        return _history_of(orjson.loads(raw))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not an encoded history: {exc}") from exc


def iter_items(db: Any) -> Iterator[tuple[bytes, bytes]]:
    """Every (key, value) of a partition database except Faust's offset row and next-offset rows."""
    for key, value in db.items():
        if key != FAUST_OFFSET_KEY and not is_next_offset_key(key):
            yield bytes(key), bytes(value)


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
        self,
        schedule: dict[int, Iterable[tuple[bytes, bytes]]],
        parked: dict[int, Iterable[tuple[bytes, bytes]]],
    ) -> int:
        rows = 0
        fresh_s: dict[int, Counter[tuple[str, str]]] = {}
        fresh_p: dict[int, Counter[tuple[str, str]]] = {}
        for target, source in ((fresh_s, schedule), (fresh_p, parked)):
            for partition, items in source.items():
                counter: Counter[tuple[str, str]] = Counter()
                for key, raw in items:
                    if key == FAUST_OFFSET_KEY:
                        continue
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
            "scheduled": scheduled, "parked": parked,
            "by_origin_topic": dict(by_topic), "by_error_class": dict(by_class),
            "parked_by_origin_topic": dict(parked_by_topic),
        }
