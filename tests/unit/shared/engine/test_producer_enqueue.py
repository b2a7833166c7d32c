"""A record batch that could not be queued in time (aiokafka's wait for the partition's
previous batch, measured on a clock that runs on while the process is stopped) is queued
again, not turned into a stopped worker; a producer that never takes it still fails. A
send queues its partitions' record batches side by side: one partition held up (its previous
batch not yet sent) holds up none of the others."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError

from shared.engine._producer import ENQUEUE_TRIES, BatchProducer, Outgoing, _enqueue
from shared.settings import Settings


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


class HeldPartitionProducer:
    """aiokafka's hold on a partition whose previous record batch has not left yet: ``send_batch``
    for ``held`` waits until released; the others are taken at once."""

    def __init__(self, held: tuple[str, int]) -> None:
        self.held = held
        self.released = asyncio.Event()
        self.others_queued = asyncio.Event()
        self.queued: list[tuple[str, int]] = []

    def create_batch(self) -> Any:
        return SimpleNamespace(append=lambda **record: record, records=0)

    async def send_batch(self, batch: Any, topic: str, partition: int) -> asyncio.Future[Any]:
        if (topic, partition) == self.held:
            await self.released.wait()
        self.queued.append((topic, partition))
        if len(self.queued) == 2:
            self.others_queued.set()
        acknowledged: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        acknowledged.set_result(SimpleNamespace(offset=10 * partition))
        return acknowledged


async def test_a_send_queues_its_partitions_side_by_side_not_one_after_another() -> None:
    producer = HeldPartitionProducer(held=("out", 0))
    sender = BatchProducer(Settings(), "unit")
    sender._producer = producer  # type: ignore[assignment]
    records = [Outgoing("out", b"k", b"v", partition=p) for p in (0, 1, 2)]
    send = asyncio.create_task(sender.send_with(producer, records, "unit"))  # type: ignore[arg-type]
    await asyncio.wait_for(producer.others_queued.wait(), 1)  # while partition 0 is held
    assert not send.done()
    assert producer.queued == [("out", 1), ("out", 2)]
    producer.released.set()
    assert await send == {("out", 0): 0, ("out", 1): 10, ("out", 2): 20}


async def test_sends_take_the_producers_in_turn() -> None:
    producers = [HeldPartitionProducer(held=("none", 0)) for _ in range(3)]
    sender = BatchProducer(Settings(), "unit", connections=3)
    sender._pool, sender._producer = producers, producers[0]  # type: ignore[assignment]
    for p in range(6):
        await sender.send([Outgoing("out", b"k", b"v", partition=p)], "unit")
    by_producer = [[partition for _, partition in producer.queued] for producer in producers]
    assert by_producer == [[2, 5], [0, 3], [1, 4]]
