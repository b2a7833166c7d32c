"""A record batch that could not be queued in time (aiokafka's wait for the partition's
previous batch, measured on a clock that runs on while the process is stopped) is queued
again, not turned into a stopped worker; a producer that never takes it still fails."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError

from shared.engine._producer import ENQUEUE_TRIES, _enqueue


class FakeProducer:
    def __init__(self, timeouts: int) -> None:
        self.timeouts = timeouts
        self.tries = 0

    async def send_batch(self, batch: Any, topic: str, partition: int) -> str:
        self.tries += 1
        if self.tries <= self.timeouts:
            raise KafkaTimeoutError()
        return f"queued {topic}[{partition}]"


def test_a_batch_not_queued_in_time_is_queued_again() -> None:
    producer = FakeProducer(timeouts=1)
    assert asyncio.run(_enqueue(producer, object(), "t", 3)) == "queued t[3]"  # type: ignore[arg-type]
    assert producer.tries == 2


def test_a_producer_that_never_takes_the_batch_still_fails() -> None:
    producer = FakeProducer(timeouts=ENQUEUE_TRIES)
    with pytest.raises(KafkaTimeoutError):
        asyncio.run(_enqueue(producer, object(), "t", 3))  # type: ignore[arg-type]
    assert producer.tries == ENQUEUE_TRIES


def test_a_batch_is_queued_again_only_if_the_check_before_it_passes() -> None:
    producer = FakeProducer(timeouts=1)

    async def dropped() -> None:
        raise RuntimeError("no longer a member")

    with pytest.raises(RuntimeError, match="no longer a member"):
        asyncio.run(_enqueue(producer, object(), "t", 3, dropped))  # type: ignore[arg-type]
    assert producer.tries == 1
