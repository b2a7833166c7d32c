"""Reads of a partition's rows in key order: what is due (ticks), pages of scheduled and
parked messages (GET /retries, GET /parked), the blocked keys of ordered retries (GET
/ordered-keys/blocked), and the parked messages a group filter covers (GET /parked-groups,
group replay and cancel)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from services.retry_scheduler.entries import classify
from services.retry_scheduler.state import ID_PREFIX, LANE_PREFIX, decode_lane, due_of, is_due_key, lane_row_key
from shared.engine import OrderedRows
from shared.ordered_retries import lane_key

# -- scans -----------------------------------------------------------------------------------------


@dataclass
class DueScan:
    """The entries due in one partition, in due order, and where the next scan may start."""

    items: list[tuple[bytes, bytes]]
    examined: int
    more_due: bool  # stopped at the limit with more entries already due
    #: The due time of the entry that ended the scan (the next to come due), None when none did.
    next_due: int | None = None


def scan_due(db: OrderedRows, now_ms: int, limit: int, start: bytes = b"") -> DueScan:
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
            break  # past the due keys (every other key sorts after them)
        examined += 1
        due = due_of(key)
        if due > now_ms:
            return DueScan(items, examined, more_due=False, next_due=due)
        if len(items) >= limit:
            return DueScan(items, examined, more_due=True)
        items.append((key, bytes(it.value())))
        it.next()
    return DueScan(items, examined, more_due=False)


def first_due_key(db: OrderedRows, start: bytes = b"") -> bytes | None:
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
    db: OrderedRows,
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
    db: OrderedRows,
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


def scan_ids(db: OrderedRows, *, after: bytes | None, limit: int, origin_topic: str | None, budget: int) -> PageScan:
    """Rows of an id-keyed table (``parked``) in id order after ``after`` (exclusive)."""
    return _scan(
        db,
        seek=after if after is not None else ID_PREFIX,
        in_range=lambda key: key.startswith(ID_PREFIX),
        after=after,
        limit=limit,
        origin_topic=origin_topic,
        budget=budget,
    )


def lanes_prefix(origin_topic: str | None) -> bytes:
    """The prefix every lane row of ``origin_topic`` starts with (all lane rows: ``None``). A lane
    key starts with its topic and a NUL, so one topic's lanes are next to each other."""
    return LANE_PREFIX if origin_topic is None else lane_row_key(lane_key(origin_topic, b""))


def scan_lanes(db: OrderedRows, *, after: bytes | None, limit: int, origin_topic: str | None, budget: int) -> PageScan:
    """Lane rows of an ``index`` partition (one per blocked key) in lane key order after ``after``
    (a lane row key, exclusive), only those of ``origin_topic`` when given."""
    prefix = lanes_prefix(origin_topic)
    return _scan(
        db,
        seek=max(after, prefix) if after is not None else prefix,
        in_range=lambda key: key.startswith(prefix),
        after=after,
        limit=limit,
        origin_topic=None,  # the seek and the range already keep to the topic's lanes
        budget=budget,
    )


@dataclass
class LaneCounts:
    """Blocked keys of ordered topics in a partition, and the records held behind their heads."""

    blocked_keys: int = 0
    held: int = 0


def count_lanes(db: OrderedRows) -> LaneCounts:
    """The lane rows of an ``index`` partition (one per blocked key: few, next to each other)."""
    counts = LaneCounts()
    it = db.iter()
    it.seek(LANE_PREFIX)
    while it.valid():
        key = bytes(it.key())
        if not key.startswith(LANE_PREFIX):
            break
        counts.blocked_keys += 1
        counts.held += decode_lane(bytes(it.value())).held
        it.next()
    return counts


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
            "origin_topic": self.origin_topic,
            "error_class": self.error_class,
            "count": self.count,
            "oldest_parked_at": self.oldest_parked_at,
            "newest_parked_at": self.newest_parked_at,
            "newest_error_message": self.newest_error_message,
        }

    @classmethod
    def from_json(cls, o: dict[str, Any]) -> ParkedGroup:
        return cls(
            str(o["origin_topic"]),
            str(o["error_class"]),
            int(o["count"]),
            o.get("oldest_parked_at"),
            o.get("newest_parked_at"),
            str(o.get("newest_error_message") or ""),
        )


@dataclass
class GroupScan:
    groups: list[ParkedGroup]
    resume: bytes | None  # where to go on when the budget ran out; None: every row was examined


def _parked_rows(db: OrderedRows, after: bytes | None) -> Iterator[tuple[bytes, bytes]]:
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


def scan_parked_groups(db: OrderedRows, flt: GroupFilter, budget: int, after: bytes | None = None) -> GroupScan:
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
    db: OrderedRows, flt: GroupFilter, *, after: bytes | None, limit: int | None, budget: int
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
