"""Small synchronous helpers over aiokafka for tests: produce, read a topic to its end."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from shared.engine.clients import delete_topics_with_prefix as delete_topics_of
from shared.engine.clients import replication_factor, until_led
from shared.settings import Settings
from tools.kafka_broker import default_layout

BOOTSTRAP = default_layout().bootstrap
#: How long :func:`create_topics` waits for a leader of every new partition.
LEADERS_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int

    @property
    def body(self) -> bytes:
        """The value of a record that must have one: a tombstone here fails the test."""
        assert self.value is not None, f"{self.topic}[{self.partition}]@{self.offset} has no value"
        return self.value


def create_topics(
    names: Iterable[str], partitions: int = 8, compacted: Iterable[str] = (), configs: dict[str, str] | None = None
) -> None:
    """Create the topics that do not exist yet; ``configs`` apply to each of them."""
    compact = set(compacted)

    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP)
        await admin.start()
        try:
            existing = set(await admin.list_topics())
            # The fleet's replication factor: the brokers' default unless the environment sets one.
            replicas = await replication_factor(Settings(kafka_bootstrap_servers=BOOTSTRAP), admin)
            new = [
                NewTopic(
                    n,
                    partitions,
                    replicas,
                    topic_configs={**(configs or {}), **({"cleanup.policy": "compact"} if n in compact else {})},
                )
                for n in names
                if n not in existing
            ]
            if new:
                with contextlib.suppress(TopicAlreadyExistsError):
                    await admin.create_topics(new)
                # The broker's metadata can trail its controller (longer while it deletes other
                # topics): a client started at once might not see them yet.
                leaderless = await until_led(admin, [t.name for t in new], LEADERS_TIMEOUT_S)
                if leaderless:
                    raise TimeoutError(
                        f"no leader for every partition of {leaderless} in the metadata within {LEADERS_TIMEOUT_S}s"
                    )
        finally:
            await admin.close()

    asyncio.run(run())


def delete_topics_with_prefix(prefix: str) -> list[str]:
    """Delete every topic of the test broker whose name starts with ``prefix``; returns their names."""
    return asyncio.run(delete_topics_of(Settings(kafka_bootstrap_servers=BOOTSTRAP), prefix))


def produce(
    topic: str,
    records: Iterable[tuple[bytes | str | None, bytes | None]],
    headers: list[tuple[str, bytes]] | None = None,
    connection: dict[str, Any] | None = None,
) -> None:
    """Send ``records``; ``connection``: the client's connection arguments, when not to the plaintext broker."""

    async def run() -> None:
        producer = AIOKafkaProducer(**(connection or {"bootstrap_servers": BOOTSTRAP}), linger_ms=5)
        await producer.start()
        try:
            for key, value in records:
                k = key.encode() if isinstance(key, str) else key
                await producer.send(topic, value, key=k, headers=headers)
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(run())


def committed_offsets(group: str, topic: str, partitions: int) -> dict[int, int | None]:
    """The offset ``group`` has committed for each partition of ``topic`` (None: nothing yet)."""

    async def run() -> dict[int, int | None]:
        consumer = AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP, group_id=group, enable_auto_commit=False)
        await consumer.start()
        try:
            return {p: await consumer.committed(TopicPartition(topic, p)) for p in range(partitions)}
        finally:
            await consumer.stop()

    return asyncio.run(run())


def unconsumed(group: str, topics: Iterable[str], timeout: float = 10.0) -> int:
    """Committed records of ``topics`` at or past the offsets ``group`` has committed: read back,
    so that transaction markers (which hold no record, yet take an offset) do not count."""

    async def run() -> int:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=BOOTSTRAP, group_id=group, enable_auto_commit=False, isolation_level="read_committed"
        )
        await consumer.start()
        try:
            await consumer._client.force_metadata_update()
            tps = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
            ends = await consumer.end_offsets(tps) if tps else {}
            starts = {tp: await consumer.committed(tp) or 0 for tp in tps}
            remaining = {tp for tp in tps if starts[tp] < ends[tp]}
            if not remaining:
                return 0
            consumer.assign(list(remaining))
            for tp in remaining:
                consumer.seek(tp, starts[tp])
            found = await _read_until(consumer, ends, remaining, timeout)
            return len(found) + len(remaining)  # a partition not read to its end is not known to be consumed
        finally:
            await consumer.stop()

    return asyncio.run(run())


async def _read_until(
    consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int], remaining: set[TopicPartition], read_for_s: float
) -> list[Any]:
    """The records of the assigned partitions in ``remaining`` from their positions up to ``ends``,
    read for at most ``read_for_s`` seconds; ``remaining`` keeps the partitions not read to their end."""
    out: list[Any] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + read_for_s
    while remaining and loop.time() < deadline:
        batch = await consumer.getmany(timeout_ms=500)
        for tp, msgs in batch.items():
            out.extend(m for m in msgs if m.offset < ends[tp])
            if msgs and msgs[-1].offset >= ends[tp] - 1:
                remaining.discard(tp)
        for tp in list(remaining):
            if await consumer.position(tp) >= ends[tp]:
                remaining.discard(tp)
    return out


def read_all(
    topic: str, timeout: float = 10.0, isolation_level: str = "read_uncommitted", connection: dict[str, Any] | None = None
) -> list[Record]:
    """Every record of ``topic`` from the beginning to its current end offsets (with
    ``read_committed``: the committed records up to the last stable offsets); ``connection``:
    the client's connection arguments, when not to the plaintext broker."""

    async def run() -> list[Record]:
        consumer = AIOKafkaConsumer(
            **(connection or {"bootstrap_servers": BOOTSTRAP}),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level=isolation_level,
        )
        await consumer.start()
        try:
            partitions = consumer.partitions_for_topic(topic)
            if not partitions:
                await consumer._client.force_metadata_update()
                partitions = consumer.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, p) for p in sorted(partitions)]
            if not tps:
                return []
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            read = await _read_until(consumer, ends, {tp for tp in tps if ends[tp] > 0}, timeout)
            return [Record(m.topic, m.partition, m.offset, m.key, m.value, tuple(m.headers), m.timestamp) for m in read]
        finally:
            await consumer.stop()

    return asyncio.run(run())
