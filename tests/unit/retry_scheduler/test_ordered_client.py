"""The client of ordered retries (shared.retry_client) against the scheduler's handlers on the
in-memory topology driver: a consumer whose handler fails on one record of a key processes that
key's records in their order all the same, each after the one before it succeeded; and so does
a consumer that restarts before it committed, reading the key's records again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.retry_scheduler.app import RetrySchedulerService
from services.retry_scheduler.state import decode_lane, lane_row_key
from shared.engine import Record, partition_for
from shared.engine.testing import TopologyDriver
from shared.ordered_retries import lane_key
from shared.retry_client import ConsumedRecord, OrderedRecords, Outgoing
from shared.settings import Settings

PARTITIONS = 4
TOPIC, RETRY_TOPIC = "orders", "retry-orders"
LANE = lane_key(TOPIC, b"k")
ROUNDS = 20


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[tuple[RetrySchedulerService, TopologyDriver]]:
    service = RetrySchedulerService(
        Settings(
            data_dir=tmp_path,
            topic_partitions=PARTITIONS,
            retry_base_delay_ms=0,  # due at once: the next tick redelivers
            retry_jitter="none",
            retry_ordered_topics=TOPIC,
        )
    )
    with TopologyDriver(service.engine) as driver:
        yield service, driver


class Consumer:
    """A user's consumer: the client's decisions, with what it sends piped to the scheduler."""

    def __init__(self, service: RetrySchedulerService, driver: TopologyDriver, failing: dict[bytes, int]) -> None:
        self.service, self.driver = service, driver
        self.records = OrderedRecords(service.topics, TOPIC, RETRY_TOPIC)
        self.failing = failing  # value → failures left
        self.processed: list[bytes | None] = []
        self.read = {RETRY_TOPIC: 0, service.topics.retry_blocked_keys: 0}

    async def handler(self, record: ConsumedRecord) -> None:
        left = self.failing.get(record.value or b"", 0)
        if left:
            self.failing[record.value or b""] = left - 1
            raise ConnectionError("downstream unavailable")
        self.processed.append(record.value)

    def consume(self, record: ConsumedRecord) -> None:
        out: Outgoing | None = self.driver.run(self.records.handle(record, self.handler))
        if out is not None:
            self.driver.pipe(out.topic, out.key, out.value, headers=out.headers)

    def new(self, topic: str) -> list[Record]:
        records = self.driver.outputs(topic)[self.read[topic] :]
        self.read[topic] += len(records)
        return records

    def follow(self) -> None:
        """One round: the scheduler's tick, then the blocked keys and the redeliveries read."""
        for partition in range(PARTITIONS):
            self.driver.run(self.service.ticks.ticker.send(partition))
        self.driver.process()
        for r in self.new(self.service.topics.retry_blocked_keys):
            self.records.blocked_keys_record(r.key, r.value, r.headers)
        for r in self.new(RETRY_TOPIC):
            self.consume(r)


def test_a_keys_records_are_processed_in_order_through_a_failure(scheduler: tuple[RetrySchedulerService, TopologyDriver]) -> None:
    service, driver = scheduler
    consumer = Consumer(service, driver, failing={b"k-2": 2})
    for offset, (key, value) in enumerate([(b"k", b"k-1"), (b"k", b"k-2"), (b"j", b"j-1"), (b"k", b"k-3"), (b"k", b"k-4")]):
        consumer.consume(Record(TOPIC, 0, offset, key, value, [], 0))
    assert consumer.processed == [b"k-1", b"j-1"]  # another key goes on
    for _ in range(ROUNDS):
        consumer.follow()
        if not consumer.records.blocked.is_blocked(b"orders\x00k"):
            break
    assert consumer.processed == [b"k-1", b"j-1", b"k-2", b"k-3", b"k-4"]
    assert driver.outputs(service.topics.retry_blocked_keys)[-1].value is None  # the key is free again, here too


def test_a_consumer_restarted_before_its_commit_hands_no_record_to_the_handler_behind_a_later_one(
    scheduler: tuple[RetrySchedulerService, TopologyDriver],
) -> None:
    service, driver = scheduler
    inputs = [(b"k", b"k-1"), (b"k", b"k-2"), (b"j", b"j-1"), (b"k", b"k-3"), (b"k", b"k-4"), (b"j", b"j-2")]
    first = Consumer(service, driver, failing={b"k-3": 1})
    for offset, (key, value) in enumerate(inputs):
        first.consume(Record(TOPIC, 0, offset, key, value, [], 0))
    driver.process()  # the scheduler takes k-3's letter in (the key's head) and k-4's (held)
    assert first.processed == [b"k-1", b"k-2", b"j-1", b"j-2"]
    # Killed before it committed anything: its successor starts from the blocked keys (read to
    # their end) and reads every record again; the handler's calls go on in the same list.
    second = Consumer(service, driver, failing=first.failing)
    second.processed = first.processed
    for r in second.new(service.topics.retry_blocked_keys):
        second.records.blocked_keys_record(r.key, r.value, r.headers)
    for offset, (key, value) in enumerate(inputs):
        second.consume(Record(TOPIC, 0, offset, key, value, [], 0))
    driver.process()
    lane = decode_lane(driver.table("index").get(lane_row_key(LANE), partition=partition_for(LANE, PARTITIONS)) or b"")
    assert lane.held == 1  # k-4 only: k-1 and k-2 are not held (nor would a park-key park them)
    for _ in range(ROUNDS):
        second.follow()
        if not second.records.blocked.is_blocked(LANE):
            break
    calls = second.processed
    assert [v for v in calls if v and v.startswith(b"k")] == [b"k-1", b"k-2", b"k-3", b"k-4"]  # none behind a later one
    assert [v for v in calls if v and v.startswith(b"j")] == [b"j-1", b"j-2", b"j-1", b"j-2"]  # free: read again in order
    assert driver.outputs(service.topics.retry_blocked_keys)[-1].value is None
