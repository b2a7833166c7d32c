"""Fixtures of the Spark integration tests: one session-scoped local SparkSession (with
the Kafka connector), and per-test Kafka and Spark settings on the test's own topics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.settings import Settings
from shared.topics import TopicNames, topic_names
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
def spark(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[object]:
    session = build_session(
        "tests", small_spark_settings(tmp_path_factory.mktemp("spark")), conf={"spark.default.parallelism": "2"}
    )
    yield session
    session.stop()


@pytest.fixture
def spark_settings(tmp_path: Path) -> SparkSettings:
    """Spark settings with this test's own checkpoint and output folders."""
    return small_spark_settings(tmp_path / "spark")


@pytest.fixture
def settings(kafka_bootstrap: str, prefix: str) -> Settings:
    return Settings(kafka_bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, topic_partitions=2)


@pytest.fixture
def topics(settings: Settings) -> TopicNames:
    return topic_names(settings)


@pytest.fixture
def job_env(monkeypatch: pytest.MonkeyPatch, kafka_bootstrap: str, prefix: str, tmp_path: Path) -> Path:
    """Environment for calling a job's ``main(argv)`` in this process; returns the Spark folder."""
    root = tmp_path / "spark"
    monkeypatch.setenv("STATEFLEET_KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("STATEFLEET_TOPIC_PREFIX", prefix)
    monkeypatch.setenv("STATEFLEET_TOPIC_PARTITIONS", "2")
    for name in ("checkpoint", "backfill", "archive"):
        monkeypatch.setenv(f"STATEFLEET_SPARK_{name.upper()}_DIR", str(root / name))
    return root
