"""Whoever sees a command's event can read its outcome: GET /commands/{id} right after the
event appears on account-events answers the outcome, never "no such command"."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.support.services import ServiceProcess

pytestmark = pytest.mark.e2e

COMMANDS = 3000


async def _events_then_reads(proc: ServiceProcess, bootstrap: str) -> tuple[int, list[tuple[str, int, str]]]:
    prefix = proc.env["STATEFLEET_TOPIC_PREFIX"]
    run = uuid.uuid4().hex[:8]
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=5)
    await consumer.start()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    misses: list[tuple[str, int, str]] = []
    read = 0
    try:
        events_topic = prefix + "account-events"
        partitions = await consumer._client.fetch_all_metadata()
        tps = [TopicPartition(events_topic, p) for p in sorted(partitions.partitions_for_topic(events_topic) or [])]
        assert tps, "the validator creates account-events before it is ready"
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        for tp in tps:
            await consumer.position(tp)
        # Straight onto the topic, as any producer may write: no "pending" record is written first.
        for i in range(COMMANDS):
            account_id = f"{run}-acct-{i}"
            command: dict[str, object] = {
                "command_id": f"{run}-{i}",
                "type": "CreateAccount",
                "account_id": account_id,
                "program_id": "visibility",
                "expected_version": None,
                "data": {},
                "issued_at": 1,
            }
            await producer.send(prefix + "account-commands", orjson.dumps(command), key=account_id.encode())
        await producer.flush()

        # A fetch can hand over thousands of events at once, each read at once: they queue for one
        # of the client's connections as long as it takes (no pool timeout), each answer within 15 s.
        async with httpx.AsyncClient(
            base_url=proc.url, timeout=httpx.Timeout(15.0, pool=None), limits=httpx.Limits(max_connections=50)
        ) as http:
            deadline = time.monotonic() + 120
            while read < COMMANDS and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=200)
                ids = [orjson.loads(m.value)["command_id"] for msgs in batch.values() for m in msgs]
                ids = [cid for cid in ids if cid.startswith(run)]
                # Every outcome is read the moment its event is seen.
                answers = await asyncio.gather(*(http.get(f"/commands/{cid}") for cid in ids))
                for cid, resp in zip(ids, answers, strict=True):
                    if resp.status_code != 200 or resp.json()["status"] != "accepted":
                        misses.append((cid, resp.status_code, resp.text[:200]))
                read += len(ids)
    finally:
        await producer.stop()
        await consumer.stop()
    return read, misses


def test_an_outcome_is_readable_as_soon_as_its_event_is_visible(shared_validator: ServiceProcess, kafka_bootstrap: str) -> None:
    read, misses = asyncio.run(_events_then_reads(shared_validator, kafka_bootstrap))
    assert read == COMMANDS
    assert misses == []
