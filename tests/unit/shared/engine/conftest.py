"""Fixtures of the engine's unit tests."""

from __future__ import annotations

from pathlib import Path

import faust
import pytest

from shared.engine._warmup import WarmupAssignor

#: Partitions of the topics and tables of the fixtures' app.
PARTITIONS = 8


@pytest.fixture
def assignor(tmp_path: Path) -> WarmupAssignor:
    """The leader's assignor of an app with one table (Faust's own objects, no broker)."""
    app = faust.App(
        "warm",
        broker="kafka://localhost:1",
        datadir=str(tmp_path),
        PartitionAssignor=WarmupAssignor,
        table_standby_replicas=1,
        topic_partitions=PARTITIONS,
    )
    app.Table("counts", default=int, partitions=PARTITIONS)
    a = app.assignor
    assert isinstance(a, WarmupAssignor)
    return a
