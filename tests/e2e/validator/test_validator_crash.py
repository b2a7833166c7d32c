"""SIGKILL the validator mid-stream, three times (twice keeping its local state, once
losing it), and check ``account-events`` afterwards: once replays are dropped by event_id,
every accepted command's event is there exactly once per (account_id, version), in
command order, with no gaps and no second event for any version."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from shared.engine import partition_for
from tests.support.kafka import BOOTSTRAP, produce, read_all
from tests.support.services import wait_for
from tools import web

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ACCOUNTS = 300
STEPS = 10  # one create and nine updates per account


def commands_in_order() -> list[tuple[str, bytes]]:
    """Round-robin over accounts; even accounts pin expected_version, odd ones do not.
    At the end every account's third command is sent again (a duplicate)."""
    out: list[tuple[str, bytes]] = []
    for step in range(STEPS):
        for i in range(ACCOUNTS):
            out.append(command(i, step))
    out.extend(command(i, 2) for i in range(ACCOUNTS))
    return out


def command(i: int, step: int) -> tuple[str, bytes]:
    a = f"crash-{i}"
    body: dict[str, Any] = {"command_id": f"{a}-{step}", "account_id": a, "issued_at": 1_700_000_000_000 + step}
    if step == 0:
        body |= {"type": "CreateAccount", "program_id": f"prog-{i % 4}", "data": {"n": 0}}
    else:
        body |= {"type": "UpdateAccount", "data": {"n": step}}
        if i % 2 == 0:
            body["expected_version"] = step
    return a, orjson.dumps(body)


def feed_in_background(commands_topic: str, stream: list[tuple[str, bytes]]) -> threading.Thread:
    """Send ``stream`` from a thread: half of it as a backlog, then steady traffic (100
    records every 0.2 s) across the kills and restarts."""

    def feed() -> None:
        half = len(stream) // 2
        produce(commands_topic, stream[:half])
        for n in range(half, len(stream), 100):
            produce(commands_topic, stream[n : n + 100])
            time.sleep(0.2)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    return feeder


class RecordCount:
    """Records on a topic (sum of end offsets), from one consumer kept open between calls."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.loop = asyncio.new_event_loop()
        self.consumer = self.loop.run_until_complete(self._start())
        self.tps: list[TopicPartition] = []

    @staticmethod
    async def _start() -> AIOKafkaConsumer:
        consumer = AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP, enable_auto_commit=False)
        await consumer.start()
        return consumer

    def __call__(self) -> int:
        return self.loop.run_until_complete(self._count())

    async def _count(self) -> int:
        if not self.tps:
            await self.consumer._client.force_metadata_update()
            self.tps = [TopicPartition(self.topic, p) for p in self.consumer.partitions_for_topic(self.topic) or ()]
            if not self.tps:
                return 0
        ends = await self.consumer.end_offsets(self.tps)
        return sum(ends.values())

    def close(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            self.loop.run_until_complete(self.consumer.stop())
        self.loop.close()


def test_sigkill_mid_stream_leaves_each_event_exactly_once_per_version(
    start_validator: Any, service_env: dict[str, str], prefix: str
) -> None:
    commands_topic, events_topic = f"{prefix}account-commands", f"{prefix}account-events"
    proc = start_validator("k")
    feeder = feed_in_background(commands_topic, commands_in_order())

    expected = ACCOUNTS * STEPS
    record_count = RecordCount(events_topic)
    killed_at: list[int] = []
    # Kill at a quarter and at three quarters keeping the local RocksDB state; at half
    # losing it, so the restarted worker restores everything from the changelogs.
    for fraction, wipe in ((0.25, False), (0.5, True), (0.75, False)):
        wait_for(
            lambda f=fraction: record_count() >= expected * f, timeout=60, interval=0.05, message=f"{fraction:.0%} of the events"
        )
        proc.kill()
        killed_at.append(record_count())
        if wipe:
            shutil.rmtree(Path(service_env["STATEFLEET_DATA_DIR"]) / "validator" / "k")
        # Every restore, warm tail or whole changelog, goes through the bulk reader here.
        proc = start_validator("k", STATEFLEET_BULK_RESTORE="true", STATEFLEET_BULK_RESTORE_MIN_LAG="1")
    feeder.join(60)
    record_count.close()

    events, by_id = assert_each_event_once(prefix, proc)
    print(
        f"killed with {killed_at} records on {events_topic}; {len(events)} records, {len(by_id)} distinct events "
        f"({len(events) - len(by_id)} replays dropped by event_id)"
    )


#: Partitions of ``account-commands`` (as the validator creates it).
COMMAND_PARTITIONS = 8
END_MARKER_PREFIX = "end-marker-"


def is_end_marker(account_or_command_id: str) -> bool:
    return account_or_command_id.startswith(END_MARKER_PREFIX)


def send_end_markers(commands_topic: str) -> set[str]:
    """A CreateAccount of a new account on each partition of ``commands_topic``, behind every
    command sent so far; returns their account ids. Once a marker's event is on
    ``account-events``, every command before it on its partition has been decided and its event
    sent: a partition's batches are decided in order, each one's events acknowledged before the
    next batch."""
    markers: dict[int, str] = {}
    while len(markers) < COMMAND_PARTITIONS:
        account_id = f"{END_MARKER_PREFIX}{uuid.uuid4().hex[:8]}"
        markers.setdefault(partition_for(account_id, COMMAND_PARTITIONS), account_id)
    produce(
        commands_topic,
        [
            (a, orjson.dumps({"command_id": a, "account_id": a, "type": "CreateAccount", "program_id": "end"}))
            for a in markers.values()
        ],
    )
    return set(markers.values())


def assert_each_event_once(
    prefix: str, proc: Any, accounts: int = ACCOUNTS, steps: int = STEPS, isolation_level: str = "read_uncommitted"
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Once every command of :func:`commands_in_order` is decided: exactly one event per
    (account, version), in command order, no gaps, no rejection; returns every event record
    read and the distinct events by event_id."""
    events_topic = f"{prefix}account-events"
    expected = accounts * steps

    def distinct_events() -> list[dict[str, Any]] | None:
        events = [orjson.loads(r.body) for r in read_all(events_topic, isolation_level=isolation_level)]
        return events if len({e["event_id"] for e in events}) >= expected else None

    wait_for(distinct_events, timeout=60, interval=0.5, message=f"{expected} distinct events")
    # Anything still to come would be a violation: read once every partition has decided an end marker.
    markers = send_end_markers(f"{prefix}account-commands")

    def through_the_markers() -> list[dict[str, Any]] | None:
        events = [orjson.loads(r.body) for r in read_all(events_topic, isolation_level=isolation_level)]
        return events if markers <= {e["account_id"] for e in events} else None

    events = wait_for(through_the_markers, timeout=60, interval=0.5, message="the end markers' events")
    events = [e for e in events if not is_end_marker(e["account_id"])]

    by_id: dict[str, dict[str, Any]] = {}
    for e in events:
        assert by_id.setdefault(e["event_id"], e) == e, "a replayed event differs from the original"
    ids_per_version: dict[tuple[str, int], set[str]] = defaultdict(set)
    for e in by_id.values():
        ids_per_version[(e["account_id"], e["version"])].add(e["event_id"])
    assert all(len(ids) == 1 for ids in ids_per_version.values()), "two different events for one version"
    assert len(by_id) == expected

    per_account: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in by_id.values():
        per_account[e["account_id"]].append(e)
    assert len(per_account) == accounts
    for account_id, evs in per_account.items():
        evs.sort(key=lambda e: e["version"])
        assert [e["version"] for e in evs] == list(range(1, steps + 1)), account_id
        assert [e["command_id"] for e in evs] == [f"{account_id}-{s}" for s in range(steps)], account_id
        assert [e["data"]["n"] for e in evs] == list(range(steps))
        assert [e["type"] for e in evs] == ["AccountCreated"] + ["AccountUpdated"] * (steps - 1)

    rejections = read_all(f"{prefix}account-rejections", isolation_level=isolation_level)
    assert rejections == [], f"no command may be rejected: {[r.value for r in rejections[:5]]}"
    for i in (0, 1, accounts - 1):
        body = web.get(f"{proc.url}/accounts/crash-{i}", timeout=10).json()
        assert body == {"account_id": f"crash-{i}", "program_id": f"prog-{i % 4}", "status": "active", "version": steps}
    return events, by_id
