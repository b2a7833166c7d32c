"""The three-node cluster of ``make broker BROKERS=3``: internal topics on every node, and a
partition's leadership moving off a SIGKILLed node while records still go in and come out."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.support.services import wait_for_async
from tools import kafka_broker

pytestmark = pytest.mark.timeout(180)


async def read_values(bootstrap: str, topic: str, count: int, timeout_s: float = 30.0) -> list[bytes]:
    """The first ``count`` values of partition 0 of ``topic``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        values: list[bytes] = []
        deadline = asyncio.get_running_loop().time() + timeout_s
        while len(values) < count and asyncio.get_running_loop().time() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=500)
            values += [m.value for m in batch.get(tp, []) if m.value is not None]
        return values
    finally:
        await consumer.stop()


async def test_internal_topics_have_a_replica_on_every_node(kafka_cluster: kafka_broker.BrokerLayout) -> None:
    group, txn = f"g-{uuid.uuid4().hex[:8]}", f"tx-{uuid.uuid4().hex[:8]}"
    # A transaction and a group's commit make the broker create both internal topics.
    producer = AIOKafkaProducer(bootstrap_servers=kafka_cluster.bootstrap, transactional_id=txn)
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send_and_wait(f"internal-{txn}", b"x")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(f"internal-{txn}", bootstrap_servers=kafka_cluster.bootstrap, group_id=group)
    await consumer.start()
    try:
        await consumer.commit({TopicPartition(f"internal-{txn}", 0): 1})
    finally:
        await consumer.stop()
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_cluster.bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(["__consumer_offsets", "__transaction_state", f"internal-{txn}"])
    finally:
        await admin.close()
    replicas = {d["topic"]: {len(p["replicas"]) for p in d["partitions"]} for d in described}
    # The topic the producer made the broker create took default.replication.factor.
    assert replicas == {"__consumer_offsets": {3}, "__transaction_state": {3}, f"internal-{txn}": {3}}
    where = await kafka_broker.partition_leaders_async(kafka_cluster.bootstrap, [], group=group, transactional_id=txn)
    assert where.group_coordinator in (1, 2, 3) and where.transaction_coordinator in (1, 2, 3)


async def test_a_killed_leaders_partitions_move_and_records_still_go_in_and_come_out(
    kafka_cluster: kafka_broker.BrokerLayout,
) -> None:
    bootstrap = kafka_cluster.bootstrap
    topic = f"failover-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 3)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    killed: int | None = None
    try:
        for i in range(10):
            await producer.send_and_wait(topic, f"before-{i}".encode(), partition=0)
        where = await kafka_broker.partition_leaders_async(bootstrap, [topic])
        leader = where.leaders[(topic, 0)]
        assert sorted(where.isr[(topic, 0)]) == [1, 2, 3]

        killed = await asyncio.to_thread(kafka_broker.kill_node, kafka_cluster, leader)
        assert kafka_broker.node_states(kafka_cluster)[leader].pid is None

        async def new_leader() -> int | None:
            now = (await kafka_broker.partition_leaders_async(bootstrap, [topic])).leaders[(topic, 0)]
            return now if now not in (-1, leader) else None

        moved_to = await wait_for_async(new_leader, 30, message=f"partition 0 of {topic} to leave node {leader}")
        assert moved_to != leader
        # Two replicas of three are left: min.insync.replicas=2 still takes acks=all writes.
        for i in range(10):
            await producer.send_and_wait(topic, f"after-{i}".encode(), partition=0)
        values = await read_values(bootstrap, topic, 20)
        assert values == [f"before-{i}".encode() for i in range(10)] + [f"after-{i}".encode() for i in range(10)]

        await asyncio.to_thread(kafka_broker.start_node, kafka_cluster, leader)
        killed = None
        assert kafka_broker.node_states(kafka_cluster)[leader].pid is not None

        async def back_in_sync() -> bool:
            isr = (await kafka_broker.partition_leaders_async(bootstrap, [topic])).isr[(topic, 0)]
            return leader in isr

        await wait_for_async(back_in_sync, 60, message=f"node {leader} to rejoin the in-sync replicas of {topic}")
    finally:
        await producer.stop()
        if killed is not None:  # the other tests of the session use the cluster too
            await asyncio.to_thread(kafka_broker.start_node, kafka_cluster, leader)
