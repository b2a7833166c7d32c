"""Fixtures every test area uses: the real broker and a unique topic prefix per test."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support import services
from tests.support.environment import owned_topic_prefix, service_environment
from tools import kafka_broker

# Property tests find counterexamples; they do not time code. Hypothesis' per-example deadline
# (200 ms) failed examples on a two-core machine busy with brokers and service processes.
settings.register_profile("statefleet", deadline=None)
settings.load_profile("statefleet")


@pytest.fixture(autouse=True)
def no_service_process_left() -> Iterator[None]:
    """Service instances a test started and left running are stopped after it (those of
    module- and session-scoped fixtures, started before it, are left to their fixtures)."""
    started = len(services.STARTED)
    yield
    for proc in services.stop_started_since(started):
        warnings.warn(f"the test left {proc.module} on {proc.url} running: stopped it", stacklevel=1)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """The real Kafka broker, started through the same code as ``make broker`` if not running."""
    layout = kafka_broker.start()
    yield layout.bootstrap


@pytest.fixture
def prefix(kafka_bootstrap: str) -> Iterator[str]:
    """A topic and consumer-group prefix of this test's own; its topics are deleted once the test
    and the fixtures that use the prefix (the service processes) are done."""
    with owned_topic_prefix() as name:
        yield name


@pytest.fixture(scope="module")
def module_prefix(kafka_bootstrap: str) -> Iterator[str]:
    """A topic and consumer-group prefix of this module's own, for the services a module shares;
    its topics are deleted after the module's last test."""
    with owned_topic_prefix() as name:
        yield name


@pytest.fixture
def service_env(kafka_bootstrap: str, prefix: str, tmp_path: Path) -> dict[str, str]:
    """Environment for service processes of one test: own topics, groups and data dirs; the
    tallies publish and the retry scheduler ticks every 0.2 s, so that tests wait less."""
    return service_environment(
        kafka_bootstrap, prefix, tmp_path / "data", tally_publish_interval_s=0.2, retry_tick_interval_s=0.2
    )
