"""Nothing is lost when the scheduler is SIGKILLed at any moment: every dead letter ends
up redelivered (with its own dlq.attempt; duplicates carry the same id and attempt) or
parked, across kills while messages are due, a kill during ingest followed by losing
the local data dir, and a kill at a random moment. Under exactly_once a committed reader
of the retry topic sees each redelivery exactly once."""

from __future__ import annotations

import random
import shutil
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from shared import dead_letters as dl
from tests.integration.retry_scheduler.helpers import letter_headers, scheduler_env, start_scheduler
from tests.support.kafka import create_topics, produce, read_all
from tests.support.services import wait_for
from tools import web

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_every_dead_letter_is_redelivered_or_parked_across_sigkills(
    kafka_bootstrap: str, prefix: str, tmp_path: Path, guarantee: str
) -> None:
    dead, retry, parking = f"{prefix}dead-letters", f"{prefix}retry-crash", f"{prefix}parking-lot"
    create_topics([dead, retry, parking])
    data = tmp_path / "data"
    env = scheduler_env(
        kafka_bootstrap,
        prefix,
        data,
        retry_base_delay_ms=1500,
        retry_max_delay_ms=3000,
        retry_jitter="full",
        retry_max_attempts=10,
        retry_policy_overrides="",
        processing_guarantee=guarantee,
    )
    # A committed reader is what exactly_once promises its guarantee to.
    isolation = "read_committed" if guarantee == "exactly_once" else "read_uncommitted"
    expected: dict[str, int] = {}  # id -> attempt it must be redelivered with
    parked: set[str] = set()

    def send_batch(n: int, label: str) -> list[str]:
        """Send ``n`` dead letters; returns the ids of those to be scheduled."""
        scheduled = []
        for i in range(n):
            dlq_id = f"{label}-{i}-{uuid.uuid4().hex[:6]}"
            if i % 25 == 0:
                parked.add(dlq_id)
                headers = letter_headers(dlq_id, retry, error="ValidationError")
            else:
                expected[dlq_id] = 1 + i % 3
                headers = letter_headers(dlq_id, retry, attempt=expected[dlq_id])
                scheduled.append(dlq_id)
            produce(dead, [(dlq_id.encode() if i % 2 else None, f"value-{dlq_id}".encode())], headers=headers)
        return scheduled

    def any_read(ids: list[str]) -> bool:
        """Whether the scheduler has read one of ``ids``: it is scheduled, or redelivered already."""
        if any(web.get(f"{proc.url}/retries/{i}", timeout=10).status_code == 200 for i in ids):
            return True
        return not {i for i, _ in redelivered()}.isdisjoint(ids)

    def redelivered() -> list[tuple[str, int]]:
        return [
            (dict(r.headers)[dl.ID].decode(), int(dict(r.headers)[dl.ATTEMPT]))
            for r in read_all(retry, isolation_level=isolation)
        ]

    proc = start_scheduler(env, tmp_path)
    try:
        # 1. killed while messages are due and being redelivered
        send_batch(150, "one")
        wait_for(lambda: len(redelivered()) >= 15, timeout=30, message="redeliveries under way")
        proc.kill()
        proc = start_scheduler(env, tmp_path, port=proc.port)

        # 2. killed while dead letters are read, then the local state is lost too
        two = send_batch(150, "two")
        # Killed once the first of them are read, while the rest are being read.
        wait_for(lambda: any_read(two[:10]), timeout=30, interval=0.05, message="the second batch being read")
        proc.kill()
        shutil.rmtree(data)
        proc = start_scheduler(env, tmp_path, port=proc.port)

        # 3. killed at a random moment: the moment is what this step tests, not an order of events
        time.sleep(random.uniform(0.0, 1.5))
        proc.kill()
        proc = start_scheduler(env, tmp_path, port=proc.port)

        wait_for(lambda: {i for i, _ in redelivered()} >= set(expected), timeout=60, message="every id redelivered")
        wait_for(
            lambda: {dict(r.headers)[dl.ID].decode() for r in read_all(parking, isolation_level=isolation)} >= parked,
            timeout=30,
            message="every invalid one parked",
        )
        # A dead letter read again after a kill, when its redelivery had already happened, is
        # scheduled again and redelivered once more (same id and attempt): wait for those too.
        stats = wait_for(
            lambda: (s := web.get(proc.url + "/retries/stats", timeout=10).json())["scheduled"] == 0 and s,
            timeout=30,
            message="nothing left scheduled",
        )
        assert stats["parked"] == len(parked)

        pairs = redelivered()
        assert {i for i, _ in pairs} == set(expected)  # nothing lost, nothing parked was redelivered
        assert all(attempt == expected[i] for i, attempt in pairs)  # each with its own attempt
        duplicates = sum(n - 1 for n in Counter(pairs).values())
        print(f"{len(expected)} redelivered, {len(parked)} parked, {duplicates} duplicate redeliveries")
        if guarantee == "exactly_once":
            # Each redelivery went out in the transaction that recorded it done.
            assert duplicates == 0
        else:
            # Done markers drop copies of dead letters already redelivered; what remains are the few
            # redeliveries whose marker was lost with the local data dir before reaching the changelog.
            assert duplicates <= len(expected) // 10
    finally:
        proc.kill()
