"""A producer keeps metadata for every topic it sends to, on the real broker."""

from __future__ import annotations

import asyncio

from aiokafka import TopicPartition

from shared.engine._producer import TopicTrackingProducer
from tests.support.kafka import create_topics


async def test_a_topic_in_use_keeps_its_metadata_when_a_newer_topic_is_first_used(kafka_bootstrap: str, prefix: str) -> None:
    older, newer = f"{prefix}older", f"{prefix}newer"
    await asyncio.to_thread(create_topics, [older])
    producer = TopicTrackingProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        # As in a worker: the older topic's metadata comes from an all-topics refresh,
        # made before the client tracks any topic (a changelog created before start).
        await producer.client.force_metadata_update()
        assert producer.client.cluster.partitions_for_topic(older)
        await (await producer.send(older, b"first", partition=3))

        # A topic created later and then used switches the client to tracked topics.
        await asyncio.to_thread(create_topics, [newer])
        await (await producer.send(newer, b"x"))
        await producer.client.force_metadata_update()

        assert producer.client.cluster.partitions_for_topic(older) == set(range(8))
        assert producer.client.cluster.leader_for_partition(TopicPartition(older, 3)) is not None
        ack = await asyncio.wait_for(await producer.send(older, b"second", partition=3), 10)
        assert ack.offset == 1
    finally:
        await producer.stop()
