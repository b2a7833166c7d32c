"""Fixtures every test area uses: the real broker and a unique topic prefix per test."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.errors import KafkaError
from hypothesis import settings

from tests.support.kafka import delete_topics_with_prefix
from tools import kafka_broker

# Property tests find counterexamples; they do not time code. Hypothesis' per-example deadline
# (200 ms) failed examples on a two-core machine busy with brokers and service processes.
settings.register_profile("statefleet", deadline=None)
settings.load_profile("statefleet")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """The real Kafka broker, started through the same code as ``make broker`` if not running."""
    layout = kafka_broker.start()
    yield layout.bootstrap


@pytest.fixture
def prefix(kafka_bootstrap: str) -> Iterator[str]:
    """A topic and consumer-group prefix of this test's own. Its topics are deleted once the test
    and the fixtures that use the prefix (the service processes) are done: every Kafka client
    start reads the metadata of all topics, so a broker that kept every test's topics (about 1,000
    by the end of the suite) would make each later service start and test client slower."""
    name = f"t{uuid.uuid4().hex[:10]}."
    yield name
    try:
        delete_topics_with_prefix(name)
    except KafkaError as exc:  # the test's outcome stands; only the broker keeps some topics longer
        warnings.warn(f"could not delete the topics of prefix {name}: {exc!r}", stacklevel=1)


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
