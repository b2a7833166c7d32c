"""A replicated cluster for the tests of how the fleet's tooling and engine use one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.kafka_cluster import running_cluster
from tools import kafka_broker


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kafka_broker.BrokerLayout]:
    """Three KRaft nodes of this test process's own (about 20 s to start; shared by its tests)."""
    with running_cluster(tmp_path_factory.mktemp("cluster")) as layout:
        yield layout
