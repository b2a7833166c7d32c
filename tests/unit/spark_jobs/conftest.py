"""A session-scoped local SparkSession for the Spark unit tests (no Kafka needed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_jobs.config import SparkSettings
from spark_jobs.session import build_session


def small_spark_settings(root: Path) -> SparkSettings:
    return SparkSettings(
        shuffle_partitions=2,
        checkpoint_dir=root / "checkpoints",
        backfill_dir=root / "backfill",
        archive_dir=root / "archive",
        local_dir=root / "tmp",
        warehouse_dir=root / "warehouse",
    )


@pytest.fixture(scope="session")
def spark_settings(tmp_path_factory: pytest.TempPathFactory) -> SparkSettings:
    return small_spark_settings(tmp_path_factory.mktemp("spark"))


@pytest.fixture(scope="session")
def spark(spark_settings: SparkSettings) -> Iterator[object]:
    session = build_session("tests", spark_settings, conf={"spark.default.parallelism": "2"})
    yield session
    session.stop()
