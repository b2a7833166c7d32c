"""The tallies' topology, as ``python -m services.tallies --describe`` prints it."""

from __future__ import annotations

from pathlib import Path

from services.tallies.app import TalliesService
from shared.settings import Settings
from tests.support.snapshots import assert_matches_snapshot


def test_the_topology_is_what_its_handlers_declare(tmp_path: Path) -> None:
    service = TalliesService(Settings(data_dir=tmp_path, topic_partitions=8, topic_prefix=""))
    assert_matches_snapshot(str(service.engine.describe()), Path(__file__).with_name("topology.txt"))
