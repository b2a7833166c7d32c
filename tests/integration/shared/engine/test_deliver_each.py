"""``deliver_each`` on the real broker: records go out as record batches per partition, each
record's outcome its own. Records keyed or given a partition land where the default partitioner
(or the caller) puts them, in order, with their headers; a record larger than a record batch
goes on its own in its place, and one larger than the producer takes fails alone."""

from __future__ import annotations

import asyncio

import pytest

from shared.engine import partition_for
from shared.engine._producer import MAX_BATCH_BYTES, BatchProducer, Outgoing
from shared.settings import Settings
from tests.support.kafka import create_topics, read_all

pytestmark = pytest.mark.integration


def test_each_record_is_delivered_in_order_and_a_too_large_one_fails_alone(kafka_bootstrap: str, prefix: str) -> None:
    topic = f"{prefix}redeliveries"
    create_topics([topic], partitions=3)
    records = [Outgoing(topic, f"k{i % 7}".encode(), f"v{i}".encode(), [("n", str(i).encode())]) for i in range(500)]
    records.insert(250, Outgoing(topic, b"k1", b"x" * (MAX_BATCH_BYTES + 1000)))
    records.insert(100, Outgoing(topic, b"k2", b"y" * (5 * 1024 * 1024)))  # over the producer's request size
    records.append(Outgoing(topic, None, b"to partition 2", partition=2))

    async def scenario() -> list[str | None]:
        producer = BatchProducer(Settings(kafka_bootstrap_servers=kafka_bootstrap), "deliver-each")
        try:
            return await producer.deliver_each(records, 15.0)
        finally:
            await producer.stop()

    errors = asyncio.run(scenario())
    assert [i for i, error in enumerate(errors) if error is not None] == [100]
    assert "MessageSizeTooLarge" in (errors[100] or "")
    read = read_all(topic)
    assert len(read) == 502
    for partition in range(3):
        expected = [
            r.value for i, r in enumerate(records) if i != 100 and r.key is not None and partition_for(r.key, 3) == partition
        ]
        got = [r.value for r in read if r.partition == partition and r.key is not None]
        assert got == expected
    by_value = {r.value: r for r in read}
    assert by_value[b"v7"].headers == (("n", b"7"),) and by_value[b"v7"].key == b"k0"
    assert by_value[b"to partition 2"].partition == 2
