"""The gated producer of at-least-once batch commits on the real broker: a request its gate
refuses sends none of its records and fails with ``WriteRefused``; a queued send that finds
the gate closed when it is about to leave (the process froze and its member was dropped
meanwhile) sends nothing either, and the producer goes on sending once the gate opens."""

from __future__ import annotations

import asyncio

import pytest

from shared.engine._producer import BatchProducer, Outgoing, WriteRefused
from shared.settings import Settings
from tests.support.kafka import create_topics, read_all

pytestmark = pytest.mark.integration


def test_a_closed_gate_sends_nothing_and_an_open_one_sends_everything(kafka_bootstrap: str, prefix: str) -> None:
    topic = f"{prefix}changelog"
    create_topics([topic], partitions=2)
    gate_open = True
    asked = 0

    async def gate() -> bool:
        nonlocal asked
        asked += 1
        return gate_open

    async def scenario() -> None:
        nonlocal gate_open
        producer = BatchProducer(Settings(kafka_bootstrap_servers=kafka_bootstrap), "gated", gate=gate)
        try:
            last = await producer.send([Outgoing(topic, b"k", b"before", partition=0)], "open")
            assert last == {(topic, 0): 0}
            gate_open = False
            with pytest.raises(WriteRefused):
                await asyncio.wait_for(
                    producer.send(
                        [Outgoing(topic, b"k", b"stale", partition=0), Outgoing(topic, b"j", b"stale", partition=1)], "closed"
                    ),
                    30,
                )
            gate_open = True
            last = await producer.send([Outgoing(topic, b"k", b"after", partition=0)], "open again")
            assert last == {(topic, 0): 1}
        finally:
            await producer.stop()

    asyncio.run(scenario())
    assert [(r.partition, r.value) for r in read_all(topic)] == [(0, b"before"), (0, b"after")]
    assert asked >= 3  # once per produce request at least


def test_an_ungated_producer_asks_nothing(kafka_bootstrap: str, prefix: str) -> None:
    topic = f"{prefix}outputs"
    create_topics([topic], partitions=1)

    async def scenario() -> dict[tuple[str, int], int]:
        producer = BatchProducer(Settings(kafka_bootstrap_servers=kafka_bootstrap), "plain")
        try:
            return await producer.send([Outgoing(topic, None, b"v", partition=0)], "plain")
        finally:
            await producer.stop()

    assert asyncio.run(scenario()) == {(topic, 0): 0}
