"""An operator can tell a restore from the local volume from a full restore from the changelog:
the worker's log line and ``statefleet_restored_records_total``, on the real broker. The
consumer lag gauge of the input comes down to 0 once its records are processed."""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.retry_scheduler.helpers import letter_headers, own_topics, start_scheduler
from tests.support.kafka import produce
from tests.support.services import ServiceProcess, wait_for
from tools import web

pytestmark = pytest.mark.integration

SERVICE = "retry_scheduler"
RESTORED = re.compile(r"restored (\d+) records from the changelog in [\d.]+ s \((\d+) of (\d+) partitions had local state\)")
LETTERS = 40


def samples(url: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = web.get(url + "/metrics", timeout=10).text
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def restored_records(proc: ServiceProcess) -> float:
    return samples(proc.url, "statefleet_restored_records_total").get((("service", SERVICE), ("source", "changelog")), 0.0)


def restore_lines(proc: ServiceProcess) -> list[tuple[int, int, int]]:
    """(records, partitions with local state, partitions) of each restore the worker logged."""
    return [tuple(map(int, m.groups())) for m in RESTORED.finditer(proc.log_path.read_text(errors="replace"))]  # type: ignore[misc]


def scheduled(url: str) -> int:
    return int(web.get(url + "/retries/stats", timeout=10).json()["scheduled"])


@pytest.mark.parametrize("bulk", ["true", "false"], ids=["bulk-restore", "faust-reader"])
def test_restores_from_the_volume_and_from_the_changelog_are_told_apart(
    kafka_bootstrap: str, prefix: str, tmp_path: Path, bulk: str
) -> None:
    topics = own_topics(kafka_bootstrap, tmp_path, "metrics", prefix)
    dead, retry, data, env = topics.dead_letters, topics.retry, topics.data, topics.env
    proc = start_scheduler(env, tmp_path)
    try:
        for i in range(LETTERS):
            dlq_id = f"slow-{i}-{uuid.uuid4().hex[:6]}"
            produce(dead, [(dlq_id.encode(), b"s")], headers=letter_headers(dlq_id, retry, origin="slow"))
        wait_for(lambda: scheduled(proc.url) == LETTERS, timeout=30, message="the letters scheduled")
        # Processed: the input's lag gauge (set every 5 s) comes down to 0.
        lag = (("service", SERVICE), ("topic", dead))
        wait_for(lambda: samples(proc.url, "statefleet_consumer_lag_records").get(lag) == 0, timeout=20, message="lag 0")
        # A first start with an empty data dir has no local state and nothing to read.
        wait_for(lambda: restore_lines(proc), timeout=10, message="the first restore logged")
        records, local, partitions = restore_lines(proc)[-1]
        assert (records, local) == (0, 0) and partitions > 0
        assert samples(proc.url, "statefleet_restore_seconds_count")[(("service", SERVICE),)] >= 1
        proc.stop()

        # Restarted on its volume: every partition had local state, next to nothing is read.
        proc = start_scheduler(env, tmp_path, port=proc.port)
        wait_for(lambda: restore_lines(proc), timeout=10, message="the restore logged")
        records, local, partitions = restore_lines(proc)[-1]
        assert local == partitions > 0
        assert records < LETTERS
        assert restored_records(proc) == records
        proc.stop()

        # Restarted without it: the whole changelog is read (by the bulk restore, or Faust's reader alone).
        shutil.rmtree(data)
        proc = start_scheduler(
            {**env, "STATEFLEET_BULK_RESTORE": bulk, "STATEFLEET_BULK_RESTORE_MIN_LAG": "1"}, tmp_path, port=proc.port
        )
        wait_for(lambda: restore_lines(proc), timeout=10, message="the restore logged")
        records, local, partitions = restore_lines(proc)[-1]
        assert local == 0 and partitions > 0
        assert records >= LETTERS  # a row per scheduled letter, at least
        assert restored_records(proc) == records
        assert scheduled(proc.url) == LETTERS
    finally:
        proc.kill()
