"""The retry scheduler's handlers on the in-memory topology driver, without a broker: a dead
letter is routed to the inbox partition of its id and scheduled; a tick redelivers what is due
to its retry topic with key, value and headers kept, once; a letter out of attempts is parked."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.retry_scheduler.app import RetrySchedulerService
from services.retry_scheduler.entries import decode_decided, encode_decided, pack_decided, unpack_decided
from services.retry_scheduler.handlers.kinds import KIND_DECIDED_PACK
from services.retry_scheduler.handlers.stats import Stats
from services.retry_scheduler.state import COUNTS_KEY, CountChange, Counts, CountsByKey, decode_counts
from shared.dead_letters import parse_dead_letter
from shared.engine import partition_for
from shared.engine.testing import TopologyDriver
from shared.settings import Settings
from tests.support.dead_letters import letter_headers

PARTITIONS = 4
RETRY_TOPIC = "retry-orders"
HOUR_MS = 3_600_000


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[tuple[RetrySchedulerService, TopologyDriver]]:
    service = RetrySchedulerService(
        Settings(
            data_dir=tmp_path,
            topic_partitions=PARTITIONS,
            retry_max_attempts=3,
            retry_base_delay_ms=HOUR_MS,
            retry_max_delay_ms=HOUR_MS,
            retry_jitter="none",
        )
    )
    with TopologyDriver(service.engine) as driver:
        yield service, driver


def send_letter(
    service: RetrySchedulerService, driver: TopologyDriver, dlq_id: str, *, attempt: int = 1, failed_at: int | None = None
) -> list[tuple[str, bytes]]:
    headers = letter_headers(dlq_id, RETRY_TOPIC, attempt=attempt, failed_at=failed_at)
    driver.pipe(service.topics.dead_letters, b"key", b"\xffvalue", headers=headers)
    return headers


def tick_every_partition(service: RetrySchedulerService, driver: TopologyDriver) -> None:
    for partition in range(PARTITIONS):
        driver.run(service.ticks.ticker.send(partition))
    driver.process()


def test_a_dead_letter_is_routed_to_its_ids_inbox_partition_and_scheduled(
    scheduler: tuple[RetrySchedulerService, TopologyDriver],
) -> None:
    service, driver = scheduler
    send_letter(service, driver, "d1")
    [routed] = driver.outputs(service.inbox_topic_name)
    assert routed.partition == partition_for(b"d1", PARTITIONS)
    assert routed.value is not None and routed.value[:1] == KIND_DECIDED_PACK
    assert [decode_decided(d).id for d in unpack_decided(routed.value[1:])] == ["d1"]
    entry = service.stats.scheduled_entry("d1")
    assert entry is not None and entry.attempt == 1 and entry.retry_topic == RETRY_TOPIC
    tick_every_partition(service, driver)
    assert driver.outputs(RETRY_TOPIC) == []  # due in an hour


def test_a_batch_of_letters_goes_to_the_inbox_as_one_pack_per_partition_in_order(
    scheduler: tuple[RetrySchedulerService, TopologyDriver],
) -> None:
    service, driver = scheduler
    ids = [f"m{i}" for i in range(40)]
    for dlq_id in ids:  # one batch: sent before one process
        driver.send(service.topics.dead_letters, b"key", b"value", headers=letter_headers(dlq_id, RETRY_TOPIC), partition=0)
    driver.process()
    packs = driver.outputs(service.inbox_topic_name)
    assert len(packs) == len({partition_for(i, PARTITIONS) for i in ids}) <= PARTITIONS
    for pack in packs:
        assert pack.value is not None and pack.value[:1] == KIND_DECIDED_PACK
        packed = [decode_decided(d).id for d in unpack_decided(pack.value[1:])]
        assert packed == [i for i in ids if partition_for(i, PARTITIONS) == pack.partition]  # in the batch's order
    assert all(service.stats.scheduled_entry(i) is not None for i in ids)
    assert service.state.totals["scheduled"] == len(ids)
    # the dead letters read again (the route's input not committed before a restart): packed
    # again, and every letter known to the inbox as a copy, none stored twice
    driver.rewind(service.topics.dead_letters, 0, 0)
    driver.process()
    assert len(driver.outputs(service.inbox_topic_name)) == 2 * len(packs)
    assert service.state.totals["scheduled"] == len(ids)


def test_a_malformed_letter_in_a_pack_is_logged_and_the_packs_other_letters_are_stored(
    scheduler: tuple[RetrySchedulerService, TopologyDriver], caplog: pytest.LogCaptureFixture
) -> None:
    service, driver = scheduler
    ids = [i for i in (f"p{n}" for n in range(100)) if partition_for(i, PARTITIONS) == 0][:2]
    now = int(time.time() * 1000)
    letters = [
        encode_decided(
            service.routing.decide_letter(
                parse_dead_letter(
                    b"k", b"v", headers, topic="dead-letters", partition=0, offset=0, timestamp_ms=now, default_retry_topic="r"
                ),
                headers,
                now,
            )
        )
        for headers in (letter_headers(i, RETRY_TOPIC) for i in ids)
    ]
    [pack] = pack_decided([letters[0], b"not a letter", letters[1]])
    driver.pipe(service.inbox_topic_name, None, KIND_DECIDED_PACK + pack, partition=0)
    assert "ignoring malformed letter 1 of the pack" in caplog.text
    assert all(service.stats.scheduled_entry(i) is not None for i in ids)


def test_a_pack_is_split_at_its_size_limit_and_read_back_whole() -> None:
    letters = [bytes([i]) * (100 + i) for i in range(1, 30)]
    packs = pack_decided(letters, limit=1000)
    assert len(packs) > 1 and all(len(p) <= 1000 for p in packs)
    assert [d for p in packs for d in unpack_decided(p)] == letters
    assert pack_decided([b"x" * 5000], limit=1000) == [b"\x00\x00\x13\x88" + b"x" * 5000]  # one alone may be larger
    for broken in (packs[0][:-1], packs[0][:3], b"\x00\x00\x00\x00"):
        with pytest.raises(ValueError):
            unpack_decided(broken)


def test_a_tick_redelivers_what_is_due_once_with_everything_kept(scheduler: tuple[RetrySchedulerService, TopologyDriver]) -> None:
    service, driver = scheduler
    headers = send_letter(service, driver, "d1", failed_at=int(time.time() * 1000) - 2 * HOUR_MS)
    tick_every_partition(service, driver)
    [redelivered] = driver.outputs(RETRY_TOPIC)
    assert (redelivered.key, redelivered.value, redelivered.headers) == (b"key", b"\xffvalue", headers)
    assert service.stats.scheduled_entry("d1") is None
    tick_every_partition(service, driver)
    assert len(driver.outputs(RETRY_TOPIC)) == 1


def test_a_letter_out_of_attempts_is_parked(scheduler: tuple[RetrySchedulerService, TopologyDriver]) -> None:
    service, driver = scheduler
    send_letter(service, driver, "d1", attempt=3)
    [parked] = driver.outputs(service.topics.parking_lot)
    assert parked.value == b"\xffvalue"
    entry = service.stats.parked_entry("d1")
    assert entry is not None and entry.attempt == 3
    assert service.stats.scheduled_entry("d1") is None


def test_the_same_attempt_of_a_parked_letter_again_is_not_parked_twice(
    scheduler: tuple[RetrySchedulerService, TopologyDriver],
) -> None:
    """A dead letter written twice (its producer's retry, a replay): one record on the parking lot."""
    service, driver = scheduler
    send_letter(service, driver, "d1", attempt=3)
    send_letter(service, driver, "d1", attempt=3)
    assert len(driver.outputs(service.topics.parking_lot)) == 1
    entry = service.stats.parked_entry("d1")
    assert entry is not None and entry.attempt == 3


def counted_from_rows(driver: TopologyDriver, partition: int) -> tuple[CountsByKey, CountsByKey]:
    counts = Counts()
    counts.rebuild({partition: driver.table("schedule").items(partition)}, {partition: driver.table("parked").items(partition)})
    return counts.scheduled[partition], counts.parked[partition]


def test_each_partitions_counts_row_is_its_rows_counted_and_what_a_recovery_loads(
    scheduler: tuple[RetrySchedulerService, TopologyDriver], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``!counts`` row goes to the changelog with the rows it counts; a recovery loads it,
    and counts a partition's rows only where the row is missing (written before it existed)."""
    service, driver = scheduler
    monkeypatch.setattr(Stats, "owned", lambda self: set(range(PARTITIONS)))  # the driver assigns nothing
    long_ago = int(time.time() * 1000) - 2 * HOUR_MS
    for i in range(12):
        send_letter(service, driver, f"s{i}")
    for i in range(6):
        send_letter(service, driver, f"d{i}", failed_at=long_ago)  # due: redelivered by the tick
    for i in range(5):
        send_letter(service, driver, f"p{i}", attempt=3)
    tick_every_partition(service, driver)
    index = driver.table("index")
    counts_changelog = {r.partition: r.value for r in driver.changelog("index") if r.key == COUNTS_KEY}
    for p in range(PARTITIONS):
        raw = index.get(COUNTS_KEY, partition=p)
        assert raw is not None and counts_changelog[p] == raw
        assert decode_counts(raw) == counted_from_rows(driver, p)
    totals = service.state.counts.totals(range(PARTITIONS))
    assert (totals["scheduled"], totals["parked"]) == (12, 5)

    drift = CountChange()
    drift.add("scheduled", ("elsewhere", "Drift"), 7)
    service.state.counts.apply(0, drift)  # counts in memory that no row says: a recovery replaces them
    driver.run(service.stats.on_recovered())
    assert service.state.counts.totals(range(PARTITIONS)) == totals

    for p in range(PARTITIONS):
        service.state.index.db(p).delete(COUNTS_KEY)
    driver.run(service.stats.on_recovered())
    assert service.state.counts.totals(range(PARTITIONS)) == totals
