"""Fixtures every test area uses: the real broker and a unique topic prefix per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools import kafka_broker


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """The real Kafka broker, started through the same code as ``make broker`` if not running."""
    layout = kafka_broker.start()
    yield layout.bootstrap


@pytest.fixture
def prefix() -> str:
    """A topic and consumer-group prefix of this test's own."""
    return f"t{uuid.uuid4().hex[:10]}."


@pytest.fixture
def service_env(kafka_bootstrap: str, prefix: str, tmp_path: Path) -> dict[str, str]:
    """Environment for service processes of one test: own topics, groups and data dirs."""
    return {
        "STATEFLEET_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "STATEFLEET_TOPIC_PREFIX": prefix,
        "STATEFLEET_DATA_DIR": str(tmp_path / "data"),
        "STATEFLEET_LOG_LEVEL": "INFO",
        "STATEFLEET_TALLY_PUBLISH_INTERVAL_S": "0.2",
        "STATEFLEET_RETRY_TICK_INTERVAL_S": "0.2",
    }
