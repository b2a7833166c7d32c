"""A dead letter in the inbox that the stream skips is still scheduled: the group's committed
offset is moved past it while the scheduler is down, as a commit of records Faust skipped
around a rebalance would, and the restarted scheduler reads it back from Kafka."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from services.retry_scheduler.entries import encode_entry, entry_from_letter
from services.retry_scheduler.handlers.kinds import KIND_LETTER
from shared import dead_letters as dl
from shared.engine._partitioning import partition_for
from tests.integration.retry_scheduler.helpers import letter_headers, scheduler_env, start_scheduler
from tests.support.kafka import BOOTSTRAP, committed_offsets, create_topics
from tests.support.services import wait_for
from tools import web

pytestmark = pytest.mark.integration


async def write_to_inbox_and_commit_past_it(inbox: str, group: str, dlq_id: str, retry_topic: str) -> int:
    """The inbox record route would write for a dead letter; then the group's offset past it."""
    headers = letter_headers(dlq_id, retry_topic, origin="slow")
    now = int(time.time() * 1000)
    letter = dl.parse_dead_letter(
        dlq_id.encode(),
        b"skipped",
        headers,
        topic="dead-letters",
        partition=0,
        offset=0,
        timestamp_ms=now,
        default_retry_topic=retry_topic,
    )
    value = KIND_LETTER + encode_entry(entry_from_letter(letter, headers, now))
    partition = partition_for(dlq_id, 8)
    producer = AIOKafkaProducer(bootstrap_servers=BOOTSTRAP)
    await producer.start()
    try:
        sent = await (await producer.send(inbox, value, key=dlq_id.encode(), partition=partition))
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(inbox, partition)
        consumer.assign([tp])
        await consumer.commit({tp: sent.offset + 1})
    finally:
        await consumer.stop()
    return int(sent.offset)


def test_a_dead_letter_the_inbox_stream_skipped_is_read_back_and_scheduled(
    kafka_bootstrap: str, prefix: str, tmp_path: Path
) -> None:
    retry = f"{prefix}retry-skipped"
    create_topics([f"{prefix}dead-letters", retry, f"{prefix}parking-lot"])
    # Without static membership a clean stop leaves the group, so its offsets can be moved.
    env = scheduler_env(kafka_bootstrap, prefix, tmp_path / "data", static_membership="false")
    inbox, group = f"{prefix}statefleet-retry_scheduler-inbox", f"{prefix}statefleet-retry_scheduler"
    proc = start_scheduler(env, tmp_path)
    # Every inbox partition has had a tick read and committed, so each has a next offset.
    wait_for(
        lambda: all(committed_offsets(group, inbox, 8).values()),
        timeout=30,
        message="a record of every inbox partition processed",
    )
    proc.stop()

    dlq_id = f"skipped-{uuid.uuid4().hex[:8]}"
    offset = asyncio.run(write_to_inbox_and_commit_past_it(inbox, group, dlq_id, retry))

    restarted = start_scheduler(env, tmp_path)
    try:
        wait_for(
            lambda: web.get(f"{restarted.url}/retries/{dlq_id}", timeout=5).status_code == 200,
            timeout=30,
            message="the skipped dead letter scheduled",
        )
        log = restarted.log_tail(200_000)
        # The hole read back holds the letter (and, when a tick was sent as the first worker
        # stopped and was not read before it, that tick before it).
        holes = [
            (int(first), int(last))
            for first, last in re.findall(
                rf"the stream skipped {re.escape(inbox)}\[{partition_for(dlq_id, 8)}\] offsets (\d+)\.\.(\d+)", log
            )
        ]
        assert any(first <= offset <= last for first, last in holes), (offset, holes)
    finally:
        restarted.kill()
