"""The engine's producer: a batch's records sent as whole record batches per partition.

Sending record by record through aiokafka costs a coroutine, a metadata lookup and a
future per record, more than the handlers' own work per record. A committed batch
knows all its records at once, so they are grouped per topic partition (keyed records
by the default partitioner, murmur2 as in Kafka's clients) and appended to aiokafka
record batches, one future per record batch. Acknowledgements come back as the offset
of each partition's last record, which is what the changelog offset of a table
partition needs.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer

from shared.engine._clients import client_kwargs, started_when_reachable
from shared.engine._durable import acknowledged
from shared.engine._partitioning import partition_for
from shared.settings import Settings

log = logging.getLogger(__name__)

#: Largest record batch (bytes); under the broker's default message.max.bytes.
MAX_BATCH_BYTES = 900_000


@dataclass(slots=True)
class Outgoing:
    """A record to send; ``partition`` None means by key (or any partition for no key)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] | None = None
    partition: int | None = None
    timestamp_ms: int | None = None  # None: now


class BatchProducer:
    """One aiokafka producer (acks=all) that sends lists of records as record batches."""

    def __init__(self, settings: Settings, client_id: str) -> None:
        self.settings = settings
        self.client_id = client_id
        self._producer: AIOKafkaProducer | None = None
        self._partitions: dict[str, int] = {}
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        async with self._lock:
            if self._producer is None:
                self._producer = await started_when_reachable(lambda: AIOKafkaProducer(
                    **client_kwargs(self.settings), client_id=self.client_id, acks="all",
                    max_batch_size=MAX_BATCH_BYTES, max_request_size=4 * 1024 * 1024, linger_ms=0,
                ), f"producer {self.client_id}")

    async def stop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()

    async def _partition_count(self, topic: str) -> int:
        count = self._partitions.get(topic)
        if count is None:
            assert self._producer is not None
            count = self._partitions[topic] = len(await self._producer.partitions_for(topic))
        return count

    async def send(self, records: Sequence[Outgoing], what: str) -> dict[tuple[str, int], int]:
        """Send ``records`` (in order per partition) and wait for every acknowledgement; returns the
        offset of the last record per (topic, partition). The first failure raises."""
        if not records:
            return {}
        if self._producer is None:
            await self.start()
        producer = self._producer
        assert producer is not None
        groups: dict[tuple[str, int], list[Outgoing]] = {}
        for record in records:
            partition = record.partition
            if partition is None:
                count = await self._partition_count(record.topic)
                partition = partition_for(record.key, count) if record.key is not None else random.randrange(count)
            group = groups.get((record.topic, partition))
            if group is None:
                group = groups[(record.topic, partition)] = []
            group.append(record)
        pending: list[tuple[tuple[str, int], int, Any]] = []
        for (topic, partition), group in groups.items():
            batch = producer.create_batch()
            n = 0
            for record in group:
                headers = list(record.headers) if record.headers else []
                if batch.append(key=record.key, value=record.value, timestamp=record.timestamp_ms, headers=headers) is None:
                    # full: send it, and start the next record batch with this record
                    if n == 0:
                        raise ValueError(f"a record for {topic} does not fit in one record batch")
                    pending.append(((topic, partition), n, await producer.send_batch(batch, topic, partition=partition)))
                    batch = producer.create_batch()
                    n = 0
                    if batch.append(key=record.key, value=record.value, timestamp=record.timestamp_ms, headers=headers) is None:
                        raise ValueError(f"a record for {topic} does not fit in one record batch")
                n += 1
            if n:
                pending.append(((topic, partition), n, await producer.send_batch(batch, topic, partition=partition)))
        metadata = await acknowledged([fut for _, _, fut in pending], f"{what}: {len(records)} records")
        last: dict[tuple[str, int], int] = {}
        for (tp, n, _), meta in zip(pending, metadata, strict=True):
            last[tp] = max(last.get(tp, -1), int(meta.offset) + n - 1)
        return last

    async def deliver_each(self, records: Sequence[Outgoing], timeout_s: float) -> list[str | None]:
        """See :meth:`shared.engine.Engine.deliver_each`."""
        if self._producer is None:
            await self.start()
        producer = self._producer
        assert producer is not None
        errors: list[str | None] = [None] * len(records)
        pending: list[tuple[int, asyncio.Future[Any]]] = []
        unavailable: dict[str, str] = {}
        for i, record in enumerate(records):
            if record.topic in unavailable:
                errors[i] = unavailable[record.topic]
                continue
            try:
                async with asyncio.timeout(timeout_s):  # waits only for an unknown topic's metadata
                    fut = await producer.send(
                        record.topic, record.value, key=record.key, partition=record.partition,
                        timestamp_ms=record.timestamp_ms, headers=list(record.headers) if record.headers else None,
                    )
            except Exception as exc:  # unknown topic, too large, timeout: the record's outcome
                errors[i] = unavailable[record.topic] = f"{type(exc).__name__}: {exc}"
                continue
            pending.append((i, fut))
        if pending:
            await asyncio.wait([fut for _, fut in pending], timeout=timeout_s)
        for i, fut in pending:
            if not fut.done():
                errors[i] = f"not acknowledged within {timeout_s:.0f}s"
            elif fut.cancelled():
                errors[i] = "send cancelled"
            elif (failure := fut.exception()) is not None:
                errors[i] = f"{type(failure).__name__}: {failure}"
        return errors
