"""The retry scheduler's topology, as ``python -m services.retry_scheduler --describe`` prints it
(with ordered retries on, so that every handler is in it)."""

from __future__ import annotations

from pathlib import Path

from services.retry_scheduler.app import RetrySchedulerService
from shared.settings import Settings
from tests.support.snapshots import assert_matches_snapshot


def test_the_topology_is_what_its_handlers_declare(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, topic_partitions=8, topic_prefix="", retry_ordered_topics="orders")
    service = RetrySchedulerService(settings)
    assert_matches_snapshot(str(service.engine.describe()), Path(__file__).with_name("topology.txt"))
