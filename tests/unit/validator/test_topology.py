"""The validator's topology, as ``python -m services.validator --describe`` prints it."""

from __future__ import annotations

from pathlib import Path

from services.validator.app import ValidatorService
from shared.settings import Settings
from tests.support.snapshots import assert_matches_snapshot


def test_the_topology_is_what_its_handlers_declare(tmp_path: Path) -> None:
    service = ValidatorService(Settings(data_dir=tmp_path, topic_partitions=8, topic_prefix=""))
    assert_matches_snapshot(str(service.engine.describe()), Path(__file__).with_name("topology.txt"))
