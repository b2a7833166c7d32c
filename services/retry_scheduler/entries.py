"""Scheduled and parked messages as bytes: an :class:`Entry` (the dead letter with its
fate and history) as the ``schedule`` and ``parked`` tables keep it, and a :class:`Decided`
dead letter as the route hop hands it to the inbox."""

from __future__ import annotations

import struct
from binascii import a2b_base64, b2a_base64
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from services.retry_scheduler.domain import MAX_DUE_MS, merge_headers
from shared.dead_letters import ATTEMPT, DLQ_HEADERS, FAILED_AT, DeadLetter

# -- entries ---------------------------------------------------------------------------------------

#: Most history events one entry keeps (the latest).
HISTORY_KEPT = 50
#: Most dead-letter fingerprints one id keeps (the latest).
FINGERPRINTS_KEPT = 16


@dataclass(frozen=True, slots=True)
class Replayed:
    """An operator's action on a message: when, which action, and the attempt it acted on."""

    at: int
    action: str
    attempt: int
    #: Who acted: the name of the token the call carried ("admin" for the one admin token); None
    #: for events recorded before actors were, and for the scheduler's own (retention).
    actor: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at, "action": self.action, "attempt": self.attempt, "actor": self.actor}


# binascii directly: base64's wrappers cost more than the encoding, a dozen times per entry.
def _b64(data: bytes | None) -> str | None:
    return None if data is None else b2a_base64(data, newline=False).decode("ascii")


# Not frozen: a frozen dataclass sets each field through ``object.__setattr__``, which made
# building one (a few times per dead letter) seven times dearer. A value all the same: nothing
# assigns its fields, and every change makes a new one (``scheduled``, ``parked``, ``with_*``).
@dataclass(slots=True)
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
    #: Fingerprints of the dead-letter records taken in for this id, oldest first (at most
    #: :data:`FINGERPRINTS_KEPT`): one read again is a duplicate, any other a new failure
    #: (``docs/dead-letter-protocol.md``, "Re-failures and duplicates").
    fingerprints: tuple[str, ...] = ()

    def scheduled(self, due_at: int, max_attempts: int) -> Entry:
        # Spelled out rather than dataclasses.replace, which costs several times more (once per dead letter).
        return Entry(
            self.id,
            self.key,
            self.value,
            self.headers,
            self.retry_topic,
            self.attempt,
            self.origin_topic,
            self.origin_partition,
            self.origin_offset,
            self.error_class,
            self.error_message,
            self.first_failed_at,
            self.failed_at,
            self.received_at,
            due_at,
            max_attempts,
            self.parked_at,
            self.parked_reason,
            self.history,
            self.fingerprints,
        )

    def parked(self, at: int, reason: str, max_attempts: int) -> Entry:
        return replace(self, parked_at=at, parked_reason=reason, max_attempts=max_attempts)

    def with_history(self, *events: Replayed) -> Entry:
        """This entry with ``events`` added to its history (at most :data:`HISTORY_KEPT`, the latest)."""
        return replace(self, history=(*self.history, *events)[-HISTORY_KEPT:])

    def with_fingerprints(self, earlier: Iterable[str]) -> Entry:
        """This entry remembering ``earlier`` fingerprints too (before its own)."""
        earlier = tuple(earlier)
        if set(earlier) <= set(self.fingerprints):
            return self
        return replace(self, fingerprints=tuple(dict.fromkeys((*earlier, *self.fingerprints)))[-FINGERPRINTS_KEPT:])

    def refailed(self, attempt: int, failed_at: int) -> Entry:
        """This dead letter taken as failed attempt ``attempt`` at ``failed_at`` (its producer sent
        an attempt already redelivered, or none): its headers say so too, and its fate is to be
        decided again."""
        headers = merge_headers(list(self.headers), [(ATTEMPT, str(attempt).encode()), (FAILED_AT, str(failed_at).encode())])
        return replace(
            self, headers=tuple(headers), attempt=attempt, failed_at=failed_at, due_at=0, parked_at=None, parked_reason=None
        )

    @property
    def counted_as(self) -> tuple[str, str]:
        """The key it is counted under (:class:`Counts`): origin topic and error class."""
        return (self.origin_topic, self.error_class)

    def parking_headers(self) -> list[tuple[str, bytes]]:
        """Every header it was redelivered with, plus when and why it was parked."""
        extra = [("dlq.parked.at", str(self.parked_at or 0).encode()), ("dlq.parked.reason", (self.parked_reason or "").encode())]
        return list(self.headers) + extra


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_MAX_ATTEMPT = (1 << 31) - 1


def clamped_numbers(letter: DeadLetter) -> tuple[int, int, int, int, int]:
    """A dead letter's attempt, origin partition and offset, first and last failure times as
    stored: clamped to what the entry keeps (the headers themselves are redelivered as they came)."""
    numbers = (letter.attempt, letter.original_partition, letter.original_offset, letter.first_failed_at, letter.failed_at)
    attempt, origin_partition, origin_offset, first_failed_at, failed_at = numbers
    if (
        1 <= attempt <= _MAX_ATTEMPT
        and _INT64_MIN <= origin_partition <= _INT64_MAX
        and _INT64_MIN <= origin_offset <= _INT64_MAX
        and 0 <= first_failed_at <= MAX_DUE_MS
        and 0 <= failed_at <= MAX_DUE_MS
    ):
        return numbers  # as read: comparisons cost less than clamping each (this runs for every letter)
    return (
        max(1, min(_MAX_ATTEMPT, letter.attempt)),
        max(_INT64_MIN, min(_INT64_MAX, letter.original_partition)),
        max(_INT64_MIN, min(_INT64_MAX, letter.original_offset)),
        max(0, min(MAX_DUE_MS, letter.first_failed_at)),
        max(0, min(MAX_DUE_MS, letter.failed_at)),
    )


def entry_from_letter(letter: DeadLetter, raw_headers: list[tuple[str, bytes]], received_at: int) -> Entry:
    """The entry for a dead letter: its headers as received, with every ``dlq.*`` header filled in.

    Numbers read from headers are clamped to what is stored (the headers themselves are
    redelivered as they came).
    """
    attempt, origin_partition, origin_offset, first_failed_at, failed_at = clamped_numbers(letter)
    # Positional: this runs once per dead letter.
    return Entry(
        letter.id,
        letter.key,
        letter.value,
        tuple(merge_headers(raw_headers, letter.dlq_headers())),
        letter.retry_topic,
        attempt,
        letter.original_topic,
        origin_partition,
        origin_offset,
        letter.error_class,
        letter.error_message,
        first_failed_at,
        failed_at,
        received_at,
        fingerprints=(letter.fingerprint,) if letter.fingerprint else (),
    )


#: An encoded entry names a ``dlq.*`` header by its place in :data:`DLQ_HEADERS` (see :func:`encode_entry`).
_DLQ_PLACE = {name: i for i, name in enumerate(DLQ_HEADERS)}


def _spelled(
    dlq_id: str,
    origin_topic: str,
    origin_partition: int,
    origin_offset: int,
    retry_topic: str,
    attempt: int,
    error_class: str,
    error_message: str,
    first_failed_at: int,
    failed_at: int,
) -> tuple[bytes, ...]:
    """The values of :data:`DLQ_HEADERS` that an entry's own fields spell (as
    :meth:`DeadLetter.dlq_headers` writes them). An entry's headers hold these values unless a
    number was clamped on the way in."""
    return (
        dlq_id.encode(),
        origin_topic.encode(),
        b"%d" % origin_partition,
        b"%d" % origin_offset,
        retry_topic.encode(),
        b"%d" % attempt,
        error_class.encode(),
        error_message.encode(),
        b"%d" % first_failed_at,
        b"%d" % failed_at,
    )


def encode_entry(e: Entry) -> bytes:
    """The entry as JSON: the key, the value and each header ``[name, value in base64]``, except a
    ``dlq.*`` header whose value is what the entry's fields spell, kept as its place in
    :data:`DLQ_HEADERS` alone: those ten would otherwise make up half of a typical entry's bytes,
    which every batch writes to the changelog and RocksDB and the route hop sends to the inbox."""
    spelled = _spelled(
        e.id,
        e.origin_topic,
        e.origin_partition,
        e.origin_offset,
        e.retry_topic,
        e.attempt,
        e.error_class,
        e.error_message,
        e.first_failed_at,
        e.failed_at,
    )
    headers = [
        place if place is not None and spelled[place] == value else [name, _b64(value)]
        for name, value in e.headers
        for place in (_DLQ_PLACE.get(name),)
    ]
    return _entry_json(e, headers, e.due_at, e.max_attempts, e.parked_at, e.parked_reason, e.history, e.fingerprints)


def _entry_json(
    e: Entry | DeadLetter,
    headers: list[Any],
    due_at: int,
    max_attempts: int,
    parked_at: int | None,
    parked_reason: str | None,
    history: tuple[Replayed, ...],
    fingerprints: tuple[str, ...],
    clamped: tuple[int, int, int, int, int, int] | None = None,
) -> bytes:
    """:func:`encode_entry`'s JSON of an entry, or of a dead letter with its ``clamped`` numbers
    (attempt, origin partition and offset, first and last failure, received at)."""
    if isinstance(e, Entry):
        attempt, origin_partition, origin_offset = e.attempt, e.origin_partition, e.origin_offset
        first_failed_at, failed_at, received_at = e.first_failed_at, e.failed_at, e.received_at
        origin_topic = e.origin_topic
    else:
        assert clamped is not None
        attempt, origin_partition, origin_offset, first_failed_at, failed_at, received_at = clamped
        origin_topic = e.original_topic
    fields: dict[str, Any] = {
        "id": e.id,
        "k": _b64(e.key),
        "v": _b64(e.value),
        "h": headers,
        "rt": e.retry_topic,
        "a": attempt,
        "ot": origin_topic,
        "op": origin_partition,
        "oo": origin_offset,
        "ec": e.error_class,
        "em": e.error_message,
        "ff": first_failed_at,
        "fa": failed_at,
        "ra": received_at,
        "due": due_at,
        "ma": max_attempts,
        "pa": parked_at,
        "pr": parked_reason,
    }
    if history:  # absent when empty: entries stored before history existed decode alike
        fields["hi"] = _history_json(history)
    if fingerprints:  # absent when empty, as history
        fields["fp"] = list(fingerprints)
    return orjson.dumps(fields)


def decided_from_letter(
    letter: DeadLetter,
    raw_headers: list[tuple[str, bytes]],
    numbers: tuple[int, int, int, int, int],
    received_at: int,
    due_at: int,
    max_attempts: int,
    park_reason: str | None = None,
) -> Decided:
    """The decided dead letter of a letter just read, its :func:`clamped_numbers` ``numbers``,
    scheduled at ``due_at`` or parked (at ``received_at``) for ``park_reason``: the same bytes as
    ``Decided.of`` of :func:`entry_from_letter` with that fate, made without the entry in
    between. The route hop does this for every dead letter; merging the headers and encoding
    them is one pass here."""
    attempt = numbers[0]
    if letter.full_form and numbers == (
        letter.attempt,
        letter.original_partition,
        letter.original_offset,
        letter.first_failed_at,
        letter.failed_at,
    ):
        # Each dlq.* header is there once and spells its field (none was clamped): kept by its place.
        headers: list[Any] = [
            [name, _b64(value)] if place is None else place for name, value in raw_headers for place in (_DLQ_PLACE.get(name),)
        ]
    else:
        headers = _merged_headers_json(letter, raw_headers, numbers)
    parked_at = None if park_reason is None else received_at
    fingerprints = (letter.fingerprint,) if letter.fingerprint else ()
    clamped = (*numbers, received_at)
    stored = _entry_json(letter, headers, due_at, max_attempts, parked_at, park_reason, (), fingerprints, clamped)
    return Decided(letter.id, parked_at is not None, attempt, due_at, (letter.original_topic, letter.error_class), stored)


def _merged_headers_json(
    letter: DeadLetter, raw_headers: list[tuple[str, bytes]], numbers: tuple[int, int, int, int, int]
) -> list[Any]:
    """The stored headers of a letter in any form, as :func:`merge_headers` then :func:`encode_entry`
    keep them: a dlq.* header takes its normalized value, once, in its first place; those the
    letter lacked follow in protocol order."""
    attempt, origin_partition, origin_offset, first_failed_at, failed_at = numbers
    normalized = letter.dlq_headers()
    spelled = _spelled(
        letter.id,
        letter.original_topic,
        origin_partition,
        origin_offset,
        letter.retry_topic,
        attempt,
        letter.error_class,
        letter.error_message,
        first_failed_at,
        failed_at,
    )
    headers: list[Any] = []
    placed = [False] * len(DLQ_HEADERS)
    for name, value in raw_headers:
        place = _DLQ_PLACE.get(name)
        if place is None:
            headers.append([name, _b64(value)])
        elif not placed[place]:
            placed[place] = True
            headers.append(_dlq_header_json(place, normalized[place][1], spelled))
    for place, done in enumerate(placed):
        if not done:
            headers.append(_dlq_header_json(place, normalized[place][1], spelled))
    return headers


def _dlq_header_json(place: int, value: bytes, spelled: tuple[bytes, ...]) -> Any:
    """A ``dlq.*`` header as :func:`encode_entry` keeps it: its place, or (a clamped number) name and value."""
    return place if spelled[place] == value else [DLQ_HEADERS[place], _b64(value)]


def _history_json(history: Iterable[Replayed]) -> list[list[Any]]:
    # The actor is a fourth element only when there is one: events written before read alike.
    return [[h.at, h.action, h.attempt] if h.actor is None else [h.at, h.action, h.attempt, h.actor] for h in history]


def _history_of(raw: Any) -> tuple[Replayed, ...]:
    return tuple(
        Replayed(int(at), str(action), int(attempt), str(rest[0]) if rest else None) for at, action, attempt, *rest in raw or ()
    )


def decode_entry(raw: bytes) -> Entry:
    """Raises ``ValueError`` (or a subclass) on bytes that are not an encoded entry. Entries
    written before ``dlq.*`` headers were kept by their place (every header ``[name, base64]``)
    decode alike."""
    # Positional and without a call per header: every redelivery decodes its entry.
    try:
        o = orjson.loads(raw)
        k, v = o["k"], o["v"]
        spelled = _spelled(o["id"], o["ot"], o["op"], o["oo"], o["rt"], o["a"], o["ec"], o["em"], o["ff"], o["fa"])
        return Entry(
            o["id"],
            None if k is None else a2b_base64(k),
            None if v is None else a2b_base64(v),
            tuple(
                [
                    (DLQ_HEADERS[h], spelled[h]) if h.__class__ is int else (h[0], b"" if h[1] is None else a2b_base64(h[1]))
                    for h in o["h"]
                ]
            ),
            o["rt"],
            o["a"],
            o["ot"],
            o["op"],
            o["oo"],
            o["ec"],
            o["em"],
            o["ff"],
            o["fa"],
            o["ra"],
            o["due"],
            o["ma"],
            o["pa"],
            o["pr"],
            _history_of(o["hi"]) if "hi" in o else (),
            tuple([str(f) for f in o["fp"]]) if "fp" in o else (),
        )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ValueError(f"not an encoded entry: {exc}") from exc


# -- decided dead letters (the inbox's letters) -----------------------------------------------------

#: Parked flag, attempt, due time, then the byte lengths of the id, origin topic and error class.
_DECIDED_HEAD = struct.Struct(">BIQIII")


@dataclass(slots=True)  # not frozen, as Entry: one per dead letter
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
        return cls(entry.id, entry.parked_at is not None, entry.attempt, entry.due_at, entry.counted_as, encode_entry(entry))


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
        fields.append(raw[at : at + n].decode())
        at += n
    if len(raw) <= at:
        raise ValueError("not a decided dead letter: truncated")
    return Decided(fields[0], bool(parked), attempt, due_at, (fields[1], fields[2]), raw[at:])


_PACKED_LENGTH = struct.Struct(">I")
#: Largest pack of decided dead letters in one inbox record, well below the broker's default
#: record size limit (1 MiB); a letter larger than this alone is a pack of one.
PACK_BYTES = 256 * 1024


def pack_decided(decided: list[bytes], limit: int = PACK_BYTES) -> list[bytes]:
    """:func:`encode_decided` bytes, several to an inbox record, in order: each prefixed with its
    length, at most ``limit`` bytes a pack (unless one alone is larger). The route hop sends a
    batch's letters for one inbox partition as one record or a few rather than one each: a
    record costs the producer, the broker and the inbox's consumer work of its own, and the
    letters were hundreds per batch."""
    packs: list[bytes] = []
    parts: list[bytes] = []
    size = 0
    for one in decided:
        if parts and size + 4 + len(one) > limit:
            packs.append(b"".join(parts))
            parts, size = [], 0
        parts.append(_PACKED_LENGTH.pack(len(one)))
        parts.append(one)
        size += 4 + len(one)
    if parts:
        packs.append(b"".join(parts))
    return packs


def unpack_decided(raw: bytes) -> list[bytes]:
    """The :func:`encode_decided` bytes of a pack, in order; raises ``ValueError`` on bytes
    :func:`pack_decided` did not make."""
    out: list[bytes] = []
    at, end = 0, len(raw)
    while at < end:
        if at + 4 > end:
            raise ValueError("not a pack of decided dead letters: truncated length")
        (n,) = _PACKED_LENGTH.unpack_from(raw, at)
        at += 4
        if n == 0 or at + n > end:
            raise ValueError("not a pack of decided dead letters: truncated")
        out.append(raw[at : at + n])
        at += n
    return out


def classify(raw: bytes) -> tuple[str, str]:
    """(origin topic, error class) of an encoded entry, for the in-memory counts."""
    o = orjson.loads(raw)
    return str(o["ot"]), str(o["ec"])


def encode_history(history: Iterable[Replayed]) -> bytes:
    return orjson.dumps(_history_json(history))


def decode_history(raw: bytes) -> tuple[Replayed, ...]:
    """Raises ``ValueError`` (or a subclass) on bytes :func:`encode_history` did not make."""
    try:
        return _history_of(orjson.loads(raw))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not an encoded history: {exc}") from exc
