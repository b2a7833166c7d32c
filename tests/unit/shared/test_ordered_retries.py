"""Ordered retries' client side without Kafka: lanes, the local view of blocked keys (a key is
blocked from the moment its dead letter is written, and freed only once the scheduler has
taken that letter in), and the letters and acknowledgements a consumer sends."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared import dead_letters as dl
from shared.ordered_retries import (
    HEAD_OFFSET,
    HEAD_PARTITION,
    HELD_BEHIND,
    LAST_TAKEN,
    BlockedKeys,
    head_position,
    header,
    is_ordered,
    lane_key,
    ordered_topics,
    split_lane_key,
)
from shared.retry_client import ConsumedRecord, OrderedRecords
from shared.topics import TopicNames

TOPIC, RETRY = "orders", "retry-orders"
LANE = lane_key(TOPIC, b"k")


@dataclass
class Rec:
    topic: str
    offset: int
    key: bytes | None = b"k"
    value: bytes | None = b"v"
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    partition: int = 0


def test_a_lane_key_is_the_topic_and_the_key_apart() -> None:
    assert split_lane_key(lane_key("orders", b"a\x00b")) == ("orders", b"a\x00b")
    assert ordered_topics(" orders, ,payments ") == {"orders", "payments"}
    topics = ordered_topics("orders")
    assert is_ordered(topics, "orders", b"k") and is_ordered(topics, "dev.orders", b"k", "dev.")
    assert not is_ordered(topics, "orders", None) and not is_ordered(topics, "payments", b"k")


def test_a_key_stays_blocked_until_its_last_letter_was_taken_in_and_then_freed() -> None:
    blocked = BlockedKeys()
    blocked.wrote(LANE, "d2")
    blocked.apply(LANE, None, None)  # a tombstone of an earlier head: d2 is still on its way
    assert blocked.is_blocked(LANE) and blocked.head_of(LANE) == "d2"
    blocked.apply(LANE, "d1", "d2")  # taken in behind d1
    assert blocked.is_blocked(LANE) and blocked.head_of(LANE) == "d1"
    blocked.apply(LANE, None, None)
    assert not blocked.is_blocked(LANE)


def test_a_failure_blocks_its_key_at_once_and_later_records_wait_behind_it() -> None:
    records = OrderedRecords(TopicNames(), TOPIC, RETRY)
    failed = records.failed(Rec(TOPIC, 10), ValueError("boom"))
    head = header(failed.headers, dl.ID)
    assert failed.topic == "dead-letters" and head is not None and header(failed.headers, dl.ATTEMPT) == b"1"
    later = Rec(TOPIC, 11)
    assert records.must_wait(later)
    deferred = records.deferred(later)
    assert header(deferred.headers, HELD_BEHIND) == head
    assert header(deferred.headers, dl.ATTEMPT) == b"0" and header(deferred.headers, dl.ID) != head
    assert not records.must_wait(Rec(TOPIC, 12, key=b"other"))
    assert not records.must_wait(Rec(TOPIC, 13, key=None))


def test_a_redelivery_never_waits_and_its_success_is_acknowledged_by_lane() -> None:
    records = OrderedRecords(TopicNames(), TOPIC, RETRY)
    records.blocked_keys_record(LANE, b"d1", [(LAST_TAKEN, b"d1")])
    redelivery = Rec(RETRY, 3, headers=[(dl.ID, b"d1"), (dl.ORIGINAL_TOPIC, TOPIC.encode()), (dl.ATTEMPT, b"1")])
    assert not records.must_wait(redelivery)
    ack = records.acknowledgement(redelivery)
    assert ack is not None and (ack.topic, ack.key, ack.value) == ("retry-acks", LANE, b"d1")
    assert records.acknowledgement(Rec(TOPIC, 4)) is None  # not a redelivery: nothing to acknowledge


def test_a_released_deferred_record_that_fails_counts_its_first_attempt_under_its_own_id() -> None:
    records = OrderedRecords(TopicNames(), TOPIC, RETRY)
    released = Rec(
        RETRY, 5, headers=[(dl.ID, b"d2"), (dl.ORIGINAL_TOPIC, TOPIC.encode()), (dl.ATTEMPT, b"0"), (HELD_BEHIND, b"d1")]
    )
    letter = records.failed(released, TimeoutError("slow"))
    assert header(letter.headers, dl.ID) == b"d2" and header(letter.headers, dl.ATTEMPT) == b"1"
    assert header(letter.headers, HELD_BEHIND) is None  # a failure, not a deferred record


def test_a_record_is_committed_only_once_the_scheduler_took_its_letter_in() -> None:
    records = OrderedRecords(TopicNames(), TOPIC, RETRY)
    first = header(records.failed(Rec(TOPIC, 10), ValueError("boom")).headers, dl.ID)
    deferred = records.deferred(Rec(TOPIC, 11))
    records.failed(Rec(TOPIC, 12, key=b"other"), ValueError("boom"))
    assert records.commit_offset(TOPIC, 0, 20) == 10 and first is not None
    records.blocked_keys_record(LANE, first, [(LAST_TAKEN, first)])  # taken in, but the deferred one is not yet
    assert records.commit_offset(TOPIC, 0, 20) == 10
    last = header(deferred.headers, dl.ID)
    assert last is not None
    records.blocked_keys_record(LANE, first, [(LAST_TAKEN, last)])
    assert records.commit_offset(TOPIC, 0, 20) == 12  # the other key's letter is still on its way
    assert records.commit_offset(TOPIC, 1, 20) == 20


def head_at(head: str, partition: int, offset: int, last: str | None = None) -> list[tuple[str, bytes]]:
    """The headers of a blocked-keys record whose head was read at ``offset`` of ``partition``."""
    return [(LAST_TAKEN, (last or head).encode()), (HEAD_PARTITION, str(partition).encode()), (HEAD_OFFSET, str(offset).encode())]


class Handler:
    """A user's handler that records the values it was handed."""

    def __init__(self) -> None:
        self.calls: list[bytes | None] = []

    async def __call__(self, record: ConsumedRecord) -> None:
        self.calls.append(record.value)


def test_a_head_is_read_with_where_it_was_read_and_only_then_puts_records_in_hand() -> None:
    assert head_position(head_at("d9", 2, 9)) == (2, 9)
    assert head_position([(LAST_TAKEN, b"d9")]) is None  # a scheduler that does not say it
    assert head_position([(HEAD_PARTITION, b"2"), (HEAD_OFFSET, b"nine")]) is None
    blocked = BlockedKeys()
    blocked.apply(LANE, "d9", "d9", (2, 9))
    assert blocked.in_hand(LANE, 2, 7) and blocked.in_hand(LANE, 2, 9)  # before the head, and the head itself
    assert not blocked.in_hand(LANE, 2, 10)  # after it: deferred, as before
    assert not blocked.in_hand(LANE, 1, 7)  # another partition tells nothing
    assert not blocked.in_hand(lane_key(TOPIC, b"other"), 2, 7)
    blocked.apply(LANE, "d10", None, (2, 10))  # the next record released: the head moves on
    assert blocked.in_hand(LANE, 2, 10)
    blocked.apply(LANE, "d10", "d10", None)  # a record without the head's place: nothing in hand
    assert not blocked.in_hand(LANE, 2, 7) and blocked.is_blocked(LANE)
    blocked.apply(LANE, "d10", None, (2, 10))
    blocked.apply(LANE, None, None)  # free: records read again are processed again, in their order
    assert not blocked.in_hand(LANE, 2, 7)


async def test_a_record_read_again_at_or_before_its_keys_head_is_skipped_not_deferred_behind_it() -> None:
    # A consumer processed k@7 and k@8, failed on k@9 and deferred k@10, and was killed before
    # it committed: its successor reads the blocked keys, then k@7 onwards again.
    records = OrderedRecords(TopicNames(), TOPIC, RETRY)
    records.blocked_keys_record(LANE, b"d9", head_at("d9", 0, 9, last="d10"))
    handler = Handler()
    for offset in (7, 8, 9):  # processed before the key was blocked, and the head itself
        assert await records.handle(Rec(TOPIC, offset, value=f"k-{offset}".encode()), handler) is None
    assert handler.calls == [] and records.commit_offset(TOPIC, 0, 10) == 10  # skipped, and committed
    deferred = await records.handle(Rec(TOPIC, 10), handler)  # after the head: waits behind it, as before
    assert deferred is not None and header(deferred.headers, HELD_BEHIND) == b"d9" and handler.calls == []
    assert await records.handle(Rec(TOPIC, 8, key=b"other", value=b"other-8"), handler) is None
    assert handler.calls == [b"other-8"]  # another key read again: processed again, in its order
    redelivery = Rec(RETRY, 3, value=b"k-9", headers=[(dl.ID, b"d9"), (dl.ORIGINAL_TOPIC, TOPIC.encode()), (dl.ATTEMPT, b"1")])
    ack = await records.handle(redelivery, handler)  # a redelivery is never in hand: it is the head
    assert handler.calls == [b"other-8", b"k-9"] and ack is not None and ack.value == b"d9"


async def test_without_the_heads_place_a_record_read_again_is_deferred_as_before() -> None:
    records = OrderedRecords(TopicNames(), TOPIC, RETRY)
    records.blocked_keys_record(LANE, b"d9", [(LAST_TAKEN, b"d9")])
    handler = Handler()
    deferred = await records.handle(Rec(TOPIC, 7), handler)
    assert deferred is not None and header(deferred.headers, HELD_BEHIND) == b"d9" and handler.calls == []
    records.blocked_keys_record(LANE, b"d9", head_at("d9", 1, 9))  # the head was read on another partition
    assert await records.handle(Rec(TOPIC, 7), handler) is not None and handler.calls == []
