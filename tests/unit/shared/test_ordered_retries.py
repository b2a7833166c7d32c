"""Ordered retries' client side without Kafka: lanes, the local view of blocked keys (a key is
blocked from the moment its dead letter is written, and freed only once the scheduler has
taken that letter in), and the letters and acknowledgements a consumer sends."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared import dead_letters as dl
from shared.ordered_retries import (
    HELD_BEHIND,
    LAST_TAKEN,
    BlockedKeys,
    header,
    is_ordered,
    lane_key,
    ordered_topics,
    split_lane_key,
)
from shared.retry_client import OrderedRecords
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
