"""The secure broker (SASL_SSL, ACLs) for the tests of this folder, and the topic prefix its
ACLs were granted for."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.environment import new_topic_prefix, settings_env
from tests.support.kafka import Record, read_all
from tools import kafka_broker


@dataclass(frozen=True)
class SecureBroker:
    layout: kafka_broker.BrokerLayout
    prefix: str

    def env(self, user: str) -> dict[str, str]:
        return {**kafka_broker.client_env(self.layout, user), **settings_env(topic_prefix=self.prefix)}

    def topic(self, base: str) -> str:
        return self.prefix + base

    @property
    def admin(self) -> dict[str, Any]:
        """The tooling's connection: the admin, above ACLs."""
        return kafka_broker.admin_kwargs(self.layout)

    def read(self, topic: str) -> list[Record]:
        """The committed records of ``topic``, read as the admin."""
        return read_all(topic, isolation_level="read_committed", connection=self.admin)


@pytest.fixture(scope="module")
def secure_broker() -> Iterator[SecureBroker]:
    # Stops the broker it started: test modules using it must not run side by side (make test
    # spreads the suite over processes by module, and only test_sasl_ssl.py runs there).
    layout = kafka_broker.secure_layout()
    was_running = kafka_broker.is_ready(layout) if layout.pid_file.exists() else False
    kafka_broker.start(layout)
    prefix = new_topic_prefix()  # the secure broker's: the test broker's cleanup cannot reach it
    kafka_broker.grant(layout, prefix)
    try:
        yield SecureBroker(layout, prefix)
    finally:
        if not was_running:
            kafka_broker.stop(layout)
