"""The archive on the real broker: every offset exactly once after a crash mid-run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spark_jobs import archive_events
from spark_jobs.checkpoint import read_checkpoint
from tests.support.environment import settings_env
from tests.support.kafka import create_topics, produce, read_all
from tests.support.services import REPO, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.integration]

DAY = 86_400_000
T0 = 1_704_067_200_000  # 2024-01-01


def events() -> list[tuple[str, bytes]]:
    out = []
    for i in range(48):
        account = f"acct-{i:02d}"
        event = {
            "event_id": f"e{i}",
            "command_id": f"c{i}",
            "type": "AccountCreated",
            "account_id": account,
            "program_id": f"prog-{i % 3}",
            "version": 1,
            "occurred_at": T0 + (i % 4) * DAY + i,
            "data": {},
        }
        out.append((account, json.dumps(event).encode()))
    out.append(("junk", b"not an event"))
    return out


def expected_row(record) -> dict[str, object]:  # type: ignore[no-untyped-def]
    try:
        event = json.loads(record.value)
    except ValueError:
        event = {}
    at = event.get("occurred_at")
    day = datetime.fromtimestamp((at if at is not None else record.timestamp) / 1000, UTC).date()
    return {
        "partition": record.partition,
        "offset": record.offset,
        "key": record.key,
        "value": record.value,
        "event_id": event.get("event_id"),
        "type": event.get("type"),
        "account_id": event.get("account_id"),
        "program_id": event.get("program_id"),
        "version": event.get("version"),
        "occurred_at": at,
        "event_date": day,
    }


def test_archive_has_every_offset_once_after_a_crash(
    spark, settings, spark_settings, topics, kafka_bootstrap, prefix, tmp_path: Path
) -> None:
    create_topics([topics.account_events], partitions=2)
    produce(topics.account_events, events())
    records = read_all(topics.account_events)
    output, checkpoint = str(tmp_path / "archive"), str(tmp_path / "checkpoint")

    # First run in its own process, small batches, killed (SIGKILL) after a few commits.
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        **settings_env(kafka_bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, spark_local_dir=tmp_path / "spark-tmp"),
    }
    log_path = tmp_path / "archive.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "spark_jobs.archive_events",
                "--available-now",
                "--max-offsets-per-trigger",
                "4",
                "--output",
                output,
                "--checkpoint",
                checkpoint,
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        commits = Path(checkpoint, "commits")

        def two_batches_committed_or_ended() -> bool:
            return proc.poll() is not None or len([p for p in commits.glob("*") if p.name.isdigit()]) >= 2

        # Past the deadline the run is killed all the same, and the checks after the rerun tell.
        with contextlib.suppress(TimeoutError):
            wait_for(two_batches_committed_or_ended, timeout=180, interval=0.1, message="two committed batches")
        assert proc.poll() is None, f"the first run ended before it could be killed:\n{log_path.read_text()[-3000:]}"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    state = read_checkpoint(spark, checkpoint)
    assert state.last_committed is not None
    assert state.last_committed < len(records) // 4 - 1, "killed mid-run, with batches left to do"

    # The restart finishes the work.
    options = archive_events.ArchiveOptions(output=output, checkpoint=checkpoint, available_now=True, max_offsets_per_trigger=4)
    archive_events.run(spark, settings, spark_settings, options)

    rows = spark.read.parquet(output).collect()
    counts = Counter((r["partition"], r["offset"]) for r in rows)
    assert sorted(counts.items()) == sorted(((r.partition, r.offset), 1) for r in records)
    assert {r["topic"] for r in rows} == {topics.account_events}
    got = sorted(
        (
            {
                k: (bytes(v) if isinstance(v, bytearray) else v)
                for k, v in r.asDict().items()
                if k not in ("topic", "kafka_timestamp", "headers")
            }
            for r in rows
        ),
        key=lambda r: (r["partition"], r["offset"]),
    )
    assert got == sorted((expected_row(r) for r in records), key=lambda r: (r["partition"], r["offset"]))
    assert sorted(p.name for p in Path(output).glob("event_date=*")) == sorted(
        {f"event_date={expected_row(r)['event_date']}" for r in records}
    )
