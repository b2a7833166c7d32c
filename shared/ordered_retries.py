"""Ordered retries: the wire format the retry scheduler and its clients share, and the
client's pure bookkeeping of blocked keys.

In ordered mode (``STATEFLEET_RETRY_ORDERED_TOPICS``) a key of an origin topic whose dead
letter is scheduled or parked is *blocked*: later records of that key wait behind that
dead letter (the *head*) in the scheduler, in order, and are redelivered one at a time,
each after the consumer acknowledged the one before it.

- A *lane* is one (origin topic, original key); :func:`lane_key` is its bytes: the topic,
  a NUL (never part of a topic name) and the key. The scheduler places every dead letter of
  a lane in the inbox partition of the lane key; acknowledgements and blocked-keys records
  are keyed by it too.
- A *deferred* record is one the consumer did not process because its key was blocked: it
  goes to ``dead-letters`` with :data:`HELD_BEHIND` (the head it knows of) and attempt 0
  (it has not failed). A record the scheduler holds carries :data:`HELD_BEHIND` with the
  head's ``dlq.id`` when it is redelivered.
- An *acknowledgement* (on ``retry-acks``, key = lane key, value = the ``dlq.id``) says a
  redelivered head was processed; only then is the next held record released.
- ``retry-blocked-keys`` (compacted; key = lane key, value = the head's ``dlq.id``, header
  :data:`LAST_TAKEN` = the last ``dlq.id`` of the lane the scheduler has taken in, headers
  :data:`HEAD_PARTITION` and :data:`HEAD_OFFSET` = where the head was read on its origin
  topic; a tombstone once the lane is free).
- A record a consumer reads again (after a crash or a rebalance, its offset not committed)
  on the head's partition at or before the head's offset is *in hand*: it was processed
  before the key was blocked, or its letter is the head or was released before it. It is
  neither processed nor deferred again (:meth:`BlockedKeys.in_hand`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from shared.dead_letters import DLQ_PREFIX
from shared.topics import configured_name

#: On a deferred dead letter: the head it waits behind (as the writer knew it). On a
#: redelivered held record: the head it waited behind in the scheduler.
HELD_BEHIND = f"{DLQ_PREFIX}held.behind"
#: On a blocked-keys record: the last ``dlq.id`` of the lane the scheduler has taken in
#: (held, made head, or parked past the cap), so a client knows its own letters arrived.
LAST_TAKEN = f"{DLQ_PREFIX}ordered.last"
#: On a blocked-keys record: the partition and the offset (decimal text) of the head's record
#: on its origin topic (its letter's ``dlq.original.partition`` and ``dlq.original.offset``).
HEAD_PARTITION = f"{DLQ_PREFIX}ordered.head.partition"
HEAD_OFFSET = f"{DLQ_PREFIX}ordered.head.offset"
#: The attempt a deferred record is written with: it has not failed yet, so its first real
#: failure (attempt 1) is newer and not taken for a copy of it.
DEFERRED_ATTEMPT = 0

_SEPARATOR = b"\x00"


def lane_key(origin_topic: str, key: bytes) -> bytes:
    """The bytes of a lane: the origin topic, NUL, the original key."""
    return origin_topic.encode() + _SEPARATOR + key


def split_lane_key(lane: bytes) -> tuple[str, bytes]:
    """(origin topic, original key) of a lane key; ``ValueError`` when it is not one."""
    topic, sep, key = lane.partition(_SEPARATOR)
    if not sep:
        raise ValueError(f"not a lane key: {lane[:80]!r}")
    return topic.decode(), key


def ordered_topics(setting: str) -> frozenset[str]:
    """The comma-separated setting as a set of topic names (blanks dropped)."""
    return frozenset(name.strip() for name in setting.split(",") if name.strip())


def is_ordered(topics: frozenset[str], origin_topic: str, key: bytes | None, topic_prefix: str = "") -> bool:
    """Whether a record of ``origin_topic`` keeps per-key order; a record without a key never
    does (it has no key to keep order by). Topics match with or without the prefix, as the
    retry policy's overrides do."""
    return key is not None and bool(topics) and configured_name(origin_topic, topics, topic_prefix) is not None


def header(headers: Iterable[tuple[str, bytes]], name: str) -> bytes | None:
    """The first value of header ``name``, or ``None``."""
    for k, v in headers:
        if k == name:
            return v
    return None


def head_position(headers: Iterable[tuple[str, bytes]]) -> tuple[int, int] | None:
    """(partition, offset) of a blocked-keys record's head on its origin topic, or ``None``
    when the record does not say it (or says it unreadably: then nothing is taken as in hand)."""
    items = list(headers)
    partition, offset = header(items, HEAD_PARTITION), header(items, HEAD_OFFSET)
    if partition is None or offset is None:
        return None
    try:
        return int(partition), int(offset)
    except ValueError:
        return None


# -- the client's blocked keys ---------------------------------------------------------------------


@dataclass
class BlockedKeys:
    """What a consumer knows of blocked lanes: the scheduler's view (the blocked-keys topic)
    and the letters it wrote itself that the scheduler may not have taken in yet.

    A lane is blocked locally from the moment the consumer writes one of its dead letters,
    before the scheduler has read it, and stays blocked until the blocked-keys topic says it
    is free *after* showing the consumer's last letter of the lane taken in: a tombstone read
    before that belongs to an earlier head, and freeing the lane then would let a later record
    overtake the letter still on its way.

    Where the scheduler's head was read (:data:`HEAD_PARTITION`, :data:`HEAD_OFFSET`) tells
    which records of the lane are *in hand* (:meth:`in_hand`).
    """

    #: Lane → head ``dlq.id``, as the blocked-keys topic says.
    heads: dict[bytes, str] = field(default_factory=dict)
    #: Lane → (partition, offset) of the head's record on its origin topic, when the
    #: blocked-keys topic says it.
    head_positions: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    #: Lane → the last ``dlq.id`` this consumer wrote for it, not yet seen taken in.
    in_flight: dict[bytes, str] = field(default_factory=dict)

    def is_blocked(self, lane: bytes) -> bool:
        return lane in self.heads or lane in self.in_flight

    def head_of(self, lane: bytes) -> str | None:
        """The head to name in a deferred letter's :data:`HELD_BEHIND`: the scheduler's, else our own last letter."""
        return self.heads.get(lane) or self.in_flight.get(lane)

    def wrote(self, lane: bytes, dlq_id: str) -> None:
        """This consumer wrote a dead letter (failed or deferred) of ``lane``: it is blocked now."""
        self.in_flight[lane] = dlq_id

    def in_hand(self, lane: bytes, partition: int, offset: int) -> bool:
        """Whether the record at ``offset`` of ``partition`` of the lane's origin topic is at or
        before the scheduler's head of the lane, on the head's partition.

        Such a record, read again (its offset was not committed when its consumer stopped), was
        handled before: a consumer reads a partition in offset order, and every record of the
        lane before the head was processed before the key was blocked, or its letter was taken
        in and released ahead of the head (or skipped or parked by an operator); the head's own
        letter is with the scheduler. Deferring it would hand it to the handler again behind
        later records of its key."""
        position = self.head_positions.get(lane)
        return position is not None and position[0] == partition and offset <= position[1]

    def apply(self, lane: bytes, head: str | None, last_taken: str | None, position: tuple[int, int] | None = None) -> None:
        """A blocked-keys record: ``head`` None for a tombstone; ``position``: where the head was
        read on its origin topic (partition, offset), when the record says it."""
        if last_taken is not None and self.in_flight.get(lane) == last_taken:
            del self.in_flight[lane]
        if head is None:
            self.heads.pop(lane, None)
        else:
            self.heads[lane] = head
        if head is None or position is None:
            self.head_positions.pop(lane, None)
        else:
            self.head_positions[lane] = position
