"""Re-failures and duplicates (``docs/dead-letter-protocol.md``, "Re-failures and duplicates"),
and the other frameworks' dead letters, on the in-memory topology driver: a letter that comes
back after its attempt was redelivered is that message's next attempt whatever its producer
wrote (the headers it got, or none), so it is parked after its attempts instead of vanishing or
looping; the same dead-letter record read twice is dropped, counted and logged."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from services.retry_scheduler.app import RetrySchedulerService
from services.retry_scheduler.handlers.kinds import KIND_CANCEL, KIND_UNPARK
from shared import dead_letters as dl
from shared.engine import partition_for
from shared.engine.testing import TopologyDriver
from shared.metrics import REGISTRY
from shared.settings import Settings
from tests.support.dead_letters import connect_headers, letter_headers, spring_headers, streams_headers

PARTITIONS = 2
RETRY_TOPIC = "retry-orders"
MAX_ATTEMPTS = 3

Scheduler = tuple[RetrySchedulerService, TopologyDriver]


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[Scheduler]:
    service = RetrySchedulerService(
        Settings(
            data_dir=tmp_path,
            topic_partitions=PARTITIONS,
            retry_max_attempts=MAX_ATTEMPTS,
            retry_base_delay_ms=0,
            retry_max_delay_ms=0,
            retry_jitter="none",
            retry_policy_overrides='{"origin_topic": {"payments": {"redeliver_to": "origin"}}}',
        )
    )
    with TopologyDriver(service.engine) as driver:
        yield service, driver


def tick(scheduler: Scheduler) -> None:
    service, driver = scheduler
    for partition in range(PARTITIONS):
        driver.run(service.ticks.ticker.send(partition))
    driver.process()


def fail(scheduler: Scheduler, headers: list[tuple[str, bytes]], timestamp_ms: int, value: bytes = b"v") -> None:
    service, driver = scheduler
    driver.pipe(service.topics.dead_letters, b"k", value, headers=headers, timestamp_ms=timestamp_ms)


def counted(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def now() -> int:
    return int(time.time() * 1000)


def test_a_producer_that_sends_back_the_headers_it_got_counts_attempts_until_parked(scheduler: Scheduler) -> None:
    """Spring's DeadLetterPublishingRecoverer copies the consumed record's headers: the same
    dlq.id and dlq.attempt come back after each redelivery."""
    service, driver = scheduler
    before = counted("statefleet_retry_refailures_total", how="attempt-kept")
    fail(scheduler, letter_headers("d1", RETRY_TOPIC), now())
    for attempt in range(1, MAX_ATTEMPTS):
        entry = service.stats.scheduled_entry("d1")
        assert entry is not None and entry.attempt == attempt
        tick(scheduler)
        redelivered = driver.outputs(RETRY_TOPIC)[-1]
        assert dict(redelivered.headers)[dl.ATTEMPT] == str(attempt).encode()
        fail(scheduler, list(redelivered.headers), now() + attempt)  # the headers as it got them
    assert service.stats.scheduled_entry("d1") is None
    parked = service.stats.parked_entry("d1")
    assert parked is not None and parked.attempt == MAX_ATTEMPTS
    [parked_record] = driver.outputs(service.topics.parking_lot)
    assert dict(parked_record.headers)[dl.ATTEMPT] == str(MAX_ATTEMPTS).encode()
    assert len(driver.outputs(RETRY_TOPIC)) == MAX_ATTEMPTS - 1
    assert counted("statefleet_retry_refailures_total", how="attempt-kept") - before == MAX_ATTEMPTS - 1


def test_a_letter_without_headers_accumulates_attempts_until_parked(scheduler: Scheduler) -> None:
    """Each re-failure is a new record at a new place on dead-letters: its id is its content's."""
    service, driver = scheduler
    dlq_id = dl.content_id(service.topics.dead_letters, b"k", b"v")
    for attempt in range(1, MAX_ATTEMPTS + 1):
        fail(scheduler, [], now() + attempt)
        tick(scheduler)
    parked = service.stats.parked_entry(dlq_id)
    assert parked is not None and parked.attempt == MAX_ATTEMPTS
    assert len(driver.outputs(service.topics.retry)) == MAX_ATTEMPTS - 1
    assert len(driver.outputs(service.topics.parking_lot)) == 1
    fail(scheduler, [], now() + 99)  # parked, not redelivered since: a copy
    assert len(driver.outputs(service.topics.parking_lot)) == 1


def test_a_producer_that_writes_an_earlier_attempt_cannot_loop(scheduler: Scheduler) -> None:
    service, _ = scheduler
    for attempt in range(1, MAX_ATTEMPTS + 1):
        fail(scheduler, letter_headers("d1", RETRY_TOPIC, attempt=1), now() + attempt)  # always attempt 1
        tick(scheduler)
    parked = service.stats.parked_entry("d1")
    assert parked is not None and parked.attempt == MAX_ATTEMPTS
    assert counted("statefleet_retry_refailures_total", how="attempt-lower") >= 1


def test_the_same_dead_letter_record_again_is_dropped_before_and_after_its_redelivery(scheduler: Scheduler) -> None:
    service, driver = scheduler
    headers, at = letter_headers("d1", RETRY_TOPIC), now()
    fail(scheduler, headers, at)
    fail(scheduler, headers, at)  # a producer's retry, before the redelivery
    fail(scheduler, headers, at + 5)  # written twice by its producer, before the redelivery
    entry = service.stats.scheduled_entry("d1")
    assert entry is not None and entry.attempt == 1
    tick(scheduler)
    before = counted("statefleet_retry_duplicates_total", kind="redelivered")
    fail(scheduler, headers, at)  # read again after the redelivery (a crash before the commit)
    fail(scheduler, headers, at + 5)
    assert service.stats.scheduled_entry("d1") is None and service.stats.parked_entry("d1") is None
    assert counted("statefleet_retry_duplicates_total", kind="redelivered") - before == 2
    tick(scheduler)
    assert len(driver.outputs(RETRY_TOPIC)) == 1


def test_a_copy_of_a_cancelled_attempt_is_dropped(scheduler: Scheduler) -> None:
    service, driver = scheduler
    fail(scheduler, letter_headers("d1", RETRY_TOPIC), now())
    cancel = KIND_CANCEL + orjson.dumps({"id": "d1"})
    driver.pipe(service.inbox_topic_name, b"d1", cancel, partition=partition_for(b"d1", PARTITIONS))
    assert service.stats.scheduled_entry("d1") is None
    fail(scheduler, letter_headers("d1", RETRY_TOPIC), now() + 1)  # never redelivered: a copy
    tick(scheduler)
    assert service.stats.scheduled_entry("d1") is None and driver.outputs(RETRY_TOPIC) == []


def test_a_spring_dead_letter_is_scheduled_with_its_origin_and_error_and_goes_where_its_policy_says(scheduler: Scheduler) -> None:
    service, driver = scheduler
    fail(
        scheduler,
        spring_headers("payments", 1, 70, dl.SPRING_WRAPPER, "Listener failed", cause="java.net.SocketTimeoutException"),
        now(),
    )
    fail(scheduler, spring_headers("orders", 0, 3, "java.lang.IllegalStateException", "no"), now())
    payments = service.stats.scheduled_entry(dl.content_id("payments", b"k", b"v"))
    assert payments is not None
    assert (payments.origin_topic, payments.origin_partition, payments.origin_offset) == ("payments", 1, 70)
    assert (payments.error_class, payments.error_message) == ("java.net.SocketTimeoutException", "Listener failed")
    assert payments.retry_topic == "payments"  # redeliver_to: origin
    orders = service.stats.scheduled_entry(dl.content_id("orders", b"k", b"v"))
    assert orders is not None and orders.retry_topic == service.topics.retry  # the default
    tick(scheduler)
    [again] = driver.outputs("payments")
    assert dict(again.headers)[dl.ID] == payments.id.encode()
    # Spring fails the redelivery again: it copies what it got and appends its own headers.
    fail(scheduler, [*again.headers, *spring_headers("payments", 1, 71, "java.lang.IllegalStateException", "twice")], now() + 1)
    second = service.stats.scheduled_entry(payments.id)
    assert second is not None and second.attempt == 2 and second.origin_offset == 70
    assert second.error_class == "java.lang.IllegalStateException"


@pytest.mark.parametrize("headers", [connect_headers, streams_headers])
def test_connect_and_streams_dead_letters_are_scheduled_with_their_origin_and_error(scheduler: Scheduler, headers) -> None:  # type: ignore[no-untyped-def]
    service, _ = scheduler
    fail(scheduler, headers("clicks", 4, 99, "org.apache.kafka.common.errors.SerializationException", "bad"), now())
    entry = service.stats.scheduled_entry(dl.content_id("clicks", b"k", b"v"))
    assert entry is not None
    assert (entry.origin_topic, entry.origin_partition, entry.origin_offset) == ("clicks", 4, 99)
    assert (entry.error_class, entry.error_message) == ("org.apache.kafka.common.errors.SerializationException", "bad")
    assert entry.retry_topic == service.topics.retry and entry.attempt == 1


def test_a_producer_that_raises_the_attempt_is_counted_as_before(scheduler: Scheduler) -> None:
    service, driver = scheduler
    before = counted("statefleet_retry_refailures_total", how="attempt-kept")
    fail(scheduler, letter_headers("d1", RETRY_TOPIC), now())
    tick(scheduler)
    [redelivered] = driver.outputs(RETRY_TOPIC)
    again = dl.dead_letter_for(
        b"k", b"v", redelivered.headers, topic=RETRY_TOPIC, partition=0, offset=0, error=KeyError("x"), retry_topic="ignored"
    )
    fail(scheduler, again.headers(), now() + 1)
    entry = service.stats.scheduled_entry("d1")
    assert entry is not None and entry.attempt == 2 and entry.error_class == "KeyError"
    assert counted("statefleet_retry_refailures_total", how="attempt-kept") == before


def test_a_re_failure_after_a_replay_from_the_parking_lot_is_parked_again_at_the_next_attempt(scheduler: Scheduler) -> None:
    service, driver = scheduler
    fail(scheduler, letter_headers("d1", RETRY_TOPIC, attempt=MAX_ATTEMPTS), now())
    assert service.stats.parked_entry("d1") is not None
    unpark = KIND_UNPARK + orjson.dumps({"id": "d1"})
    driver.pipe(service.inbox_topic_name, b"d1", unpark, partition=partition_for(b"d1", PARTITIONS))
    [replayed] = driver.outputs(RETRY_TOPIC)
    assert service.stats.parked_entry("d1") is None
    fail(scheduler, list(replayed.headers), now() + 1)  # the headers as it got them
    parked = service.stats.parked_entry("d1")
    assert parked is not None and parked.attempt == MAX_ATTEMPTS + 1
    assert len(driver.outputs(service.topics.parking_lot)) == 2


def test_every_drop_is_logged_with_its_reason(scheduler: Scheduler, caplog: pytest.LogCaptureFixture) -> None:
    headers, at = letter_headers("d1", RETRY_TOPIC), now()
    with caplog.at_level(logging.INFO, logger="services.retry_scheduler.handlers.inbox_state"):
        fail(scheduler, headers, at)
        fail(scheduler, headers, at)
        tick(scheduler)
        fail(scheduler, headers, at)
    dropped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dropped a dead letter")]
    assert dropped == [
        "dropped a dead letter of dlq.id=d1 attempt=1: attempt 1 is scheduled and not redelivered yet",
        "dropped a dead letter of dlq.id=d1 attempt=1: the same dead-letter record again (redelivered)",
    ]
