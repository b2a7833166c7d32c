"""A tick that cannot be sent (the broker away) is not an error of the worker: an exception
out of a timer would crash it, and the next interval sends the tick again. A partition whose
earliest entry has come due is ticked at once, not at the next interval."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from services.retry_scheduler.app import RetrySchedulerService
from shared.engine import partition_for
from shared.engine.testing import TopologyDriver
from shared.settings import Settings
from tests.support.dead_letters import letter_headers


def test_a_tick_that_cannot_be_sent_is_logged_and_sent_again_later(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    service = RetrySchedulerService(Settings(data_dir=tmp_path))
    sent: list[int | None] = []

    async def broker_away(topic: str, key: bytes | None, value: bytes | None, **kwargs: object) -> None:
        raise ConnectionError("Connect call failed ('127.0.0.1', 9092)")

    async def broker_back(topic: str, key: bytes | None, value: bytes | None, **kwargs: object) -> None:
        sent.append(kwargs.get("partition"))  # type: ignore[arg-type]

    service.engine.send = broker_away  # type: ignore[method-assign,assignment]
    with caplog.at_level(logging.WARNING):
        asyncio.run(service.ticks.ticker.send(3))
    assert 3 not in service.ticks.ticker.in_flight()  # not counted as queued: the next interval sends it
    assert "could not send the tick of inbox partition 3" in caplog.text

    service.engine.send = broker_back  # type: ignore[method-assign,assignment]
    asyncio.run(service.ticks.ticker.send(3))
    assert sent == [3] and 3 in service.ticks.ticker.in_flight()


def test_a_partition_is_ticked_as_soon_as_its_earliest_entry_is_due_not_at_the_next_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler knows each partition's earliest due time (from its last tick, lowered by what
    is scheduled since); a check far more frequent than the interval ticks a partition once that
    time has come, and leaves the others alone."""
    hour_ms = 3_600_000
    service = RetrySchedulerService(
        Settings(
            data_dir=tmp_path, topic_partitions=4, retry_base_delay_ms=hour_ms, retry_max_delay_ms=hour_ms, retry_jitter="none"
        )
    )
    with TopologyDriver(service.engine) as driver:
        monkeypatch.setattr(service.state.schedule, "owned_partitions", lambda: set(range(4)))
        now = int(time.time() * 1000)
        due_now = letter_headers("due-now", "retry-orders", failed_at=now - 2 * hour_ms)
        later = letter_headers("later", "retry-orders", failed_at=now)
        driver.pipe(service.topics.dead_letters, b"k", b"v", headers=later)
        later_partition = partition_for(b"later", 4)
        assert service.state.next_due == {later_partition: now + hour_ms}
        driver.run(service.ticks.send_due_ticks())
        assert service.ticks.ticker.in_flight() == set()  # nothing due: no tick
        driver.pipe(service.topics.dead_letters, b"k", b"v", headers=due_now)
        due_partition = partition_for(b"due-now", 4)
        driver.run(service.ticks.send_due_ticks())
        assert service.ticks.ticker.in_flight() == {due_partition}
        driver.process()
        [redelivered] = driver.outputs("retry-orders")
        assert dict(redelivered.headers)["dlq.id"] == b"due-now"
        # The tick learnt its partition's next due time from its scan: none left there.
        assert service.state.next_due.get(due_partition) == (now + hour_ms if due_partition == later_partition else None)
        driver.run(service.ticks.send_due_ticks())
        assert service.ticks.ticker.in_flight() == set()
