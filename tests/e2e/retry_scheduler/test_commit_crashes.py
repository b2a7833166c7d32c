"""SIGKILL the retry scheduler at each step of a batch's commit (``STATEFLEET_CRASH_AT``,
see ``shared/engine/_faults.py``) while its ticks redeliver a backlog of due dead letters:
twice, losing the local data dir after the second kill, then to the end (kills while
dead letters are read are in ``test_crash.py``). Afterwards every dead letter is redelivered with its own attempt or parked,
nothing else. With exactly_once, a read_committed consumer of the retry topic and of the
parking lot sees each of them exactly once, whatever step the worker died at."""

from __future__ import annotations

import shutil
import time
from collections import Counter
from pathlib import Path

import pytest

from shared import dead_letters as dl
from tests.integration.retry_scheduler.helpers import letter_headers, scheduler_env
from tests.support.kafka import create_topics, produce, read_all
from tests.support.services import ServiceProcess, free_port, run_until_killed, wait_for
from tools import web

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: Each letter is due this long after the scheduler stored it (its failed_at lies ahead, and the
#: backoff starts from the earlier of failed_at and now): far longer than storing them takes.
DELAY_MS = 20_000


@pytest.mark.parametrize(
    ("guarantee", "step"),
    [
        ("exactly_once", "handled"),
        ("exactly_once", "sent"),
        ("exactly_once", "logged"),
        # at_least_once repeats what a kill between the sends and the changelog leaves unrecorded:
        # the step where the two modes differ (test_crash.py kills it at random moments too).
        ("at_least_once", "sent"),
    ],
)
def test_sigkill_at_each_commit_step_redelivers_or_parks_each_letter(
    step: str, guarantee: str, kafka_bootstrap: str, prefix: str, tmp_path: Path
) -> None:
    dead, retry, parking = f"{prefix}dead-letters", f"{prefix}retry-commit", f"{prefix}parking-lot"
    create_topics([dead, retry, parking])
    data = tmp_path / "data"
    env = {
        **scheduler_env(kafka_bootstrap, prefix, data),
        "STATEFLEET_PROCESSING_GUARANTEE": guarantee,
        "STATEFLEET_INSTANCE_ID": "c",
        "STATEFLEET_CONSUMER_MAX_POLL_RECORDS": "20",
        # Due well after they are stored, and redelivered a few per tick: many tick commits.
        "STATEFLEET_RETRY_BASE_DELAY_MS": str(DELAY_MS),
        "STATEFLEET_RETRY_MAX_DELAY_MS": str(DELAY_MS),
        "STATEFLEET_RETRY_BATCH_LIMIT": "5",
        "STATEFLEET_RETRY_POLICY_OVERRIDES": "",
    }
    isolation = "read_committed" if guarantee == "exactly_once" else "read_uncommitted"
    expected: dict[str, int] = {}  # id -> the attempt it is redelivered with
    parked: set[str] = set()
    ahead = int(time.time() * 1000) + 3_600_000
    for i in range(120):
        dlq_id = f"{step}-{i}"
        if i % 20 == 0:
            parked.add(dlq_id)
            headers = letter_headers(dlq_id, retry, error="ValidationError", failed_at=ahead)  # never retried: parked at once
        else:
            expected[dlq_id] = 1 + i % 3
            headers = letter_headers(dlq_id, retry, attempt=expected[dlq_id], failed_at=ahead)
        produce(dead, [(dlq_id.encode(), f"value-{dlq_id}".encode())], headers=headers)

    port = free_port()
    proc = ServiceProcess("retry_scheduler", env, tmp_path / "scheduler-2.log", port=port).start().wait_ready()
    try:  # everything stored, nothing due yet

        def stored() -> tuple[int, int]:
            stats = web.get(proc.url + "/retries/stats", timeout=10).json()
            return stats["scheduled"], stats["parked"]

        wait_for(
            lambda: stored() == (len(expected), len(parked)),
            timeout=60,
            message=f"every letter stored: {len(expected)} scheduled, {len(parked)} parked",
        )
    finally:
        proc.kill()
    time.sleep(DELAY_MS / 1000)  # all due: each commit from here on is a tick's redeliveries
    run_until_killed("retry_scheduler", env, tmp_path / "scheduler-3.log", port, f"{step}:2")
    run_until_killed("retry_scheduler", env, tmp_path / "scheduler-4.log", port, f"{step}:3")
    shutil.rmtree(data)  # the last kill's local state is lost: the changelogs restore it
    proc = ServiceProcess("retry_scheduler", env, tmp_path / "scheduler-5.log", port=port).start().wait_ready()
    try:

        def ids(topic: str) -> list[str]:
            return [dict(r.headers)[dl.ID].decode() for r in read_all(topic, isolation_level=isolation)]

        wait_for(lambda: set(ids(retry)) >= set(expected), timeout=60, message="every id redelivered")
        wait_for(lambda: set(ids(parking)) >= parked, timeout=30, message="every invalid one parked")
        wait_for(
            lambda: web.get(proc.url + "/retries/stats", timeout=10).json()["scheduled"] == 0,
            timeout=30,
            message="nothing left scheduled",
        )
        redelivered = [
            (dict(r.headers)[dl.ID].decode(), int(dict(r.headers)[dl.ATTEMPT]))
            for r in read_all(retry, isolation_level=isolation)
        ]
        assert {i for i, _ in redelivered} == set(expected), "nothing lost, nothing parked redelivered"
        assert all(attempt == expected[i] for i, attempt in redelivered), "each with its own attempt"
        assert set(ids(parking)) == parked
        if guarantee == "exactly_once":
            repeated = {pair: n for pair, n in Counter(redelivered).items() if n > 1}
            assert repeated == {}, f"redeliveries seen twice read_committed: {list(repeated.items())[:5]}"
            parked_twice = {i: n for i, n in Counter(ids(parking)).items() if n > 1}
            assert parked_twice == {}, f"parking-lot records seen twice read_committed: {parked_twice}"
    finally:
        proc.kill()
