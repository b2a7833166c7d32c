"""The idempotent sink's look-up of what a re-run batch already wrote."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from spark_jobs.kafka_sink import BATCH_HEADER, QUERY_HEADER, KafkaBatchSink
from tests.support.kafka import BOOTSTRAP, create_topics, read_all

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def send(topic: str, records: list[tuple[int, bytes, bytes, list[tuple[str, bytes]], int]]) -> None:
    """(partition, key, value, headers, timestamp ms) each."""

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=BOOTSTRAP)
        await producer.start()
        try:
            for partition, key, value, headers, ts in records:
                await producer.send_and_wait(topic, value, key=key, partition=partition, headers=headers, timestamp_ms=ts)
        finally:
            await producer.stop()

    asyncio.run(run())


def fake_checkpoint(root: Path, query_id: str, planned: int, committed: int | None, planned_at: int) -> str:
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    for batch in range(planned + 1):
        (root / "offsets" / str(batch)).write_text(
            "v1\n" + json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": planned_at}) + "\n{}\n"
        )
    for batch in range(committed + 1 if committed is not None else 0):
        (root / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    return str(root)


def test_a_rerun_batch_writes_only_what_is_missing(spark, settings, spark_settings, topics, tmp_path: Path) -> None:
    topic = topics.activations
    # One record is stamped 30 days back, past the broker's 7-day retention: without this
    # the retention check (every 5 minutes) may delete it before the test reads it.
    create_topics([topic], partitions=3, configs={"retention.ms": "-1"})
    now = int(time.time() * 1000)
    old = now - 30 * 86_400_000

    def tags(query: str, batch: int) -> list[tuple[str, bytes]]:
        return [(QUERY_HEADER, query.encode()), (BATCH_HEADER, str(batch).encode())]

    send(
        topic,
        [
            (0, b"a", b"va", tags("q1", 4), now),  # batch 4 of this query, written before the crash
            (1, b"z", b"vz", tags("q1", 3), old),  # an old batch, long ago; partition 2 stays empty
            (0, b"b", b"vb", tags("q2", 4), now),  # another query's batch 4
        ],
    )
    checkpoint = fake_checkpoint(tmp_path / "ck", "q1", planned=4, committed=3, planned_at=now - 1000)
    sink = KafkaBatchSink(spark, settings, spark_settings, topic, checkpoint)
    assert sink.pending == 4
    assert sorted(tuple(r) for r in sink.already_written(4).collect()) == [(b"a", b"va")]

    batch = spark.createDataFrame([("a", "va"), ("b", "vb"), ("c", "vc")], "key string, value string")
    sink(batch, 4)
    written = [(r.key, r.value, dict(r.headers).get(BATCH_HEADER)) for r in read_all(topic)]
    assert sorted(written) == [
        (b"a", b"va", b"4"),
        (b"b", b"vb", b"4"),
        (b"b", b"vb", b"4"),
        (b"c", b"vc", b"4"),
        (b"z", b"vz", b"3"),
    ]

    # A batch that is not the re-run one is written as it is.
    sink(spark.createDataFrame([("a", "va")], "key string, value string"), 5)
    assert sum(1 for r in read_all(topic) if r.key == b"a") == 2
