"""The replication factor of the topics the fleet creates: the settings', else the brokers' default."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.protocol.admin import DescribeConfigsResponse_v2

from shared.engine import _admin
from shared.engine._access import BrokerAccessDenied
from shared.engine._admin import replication_factor, resolve_replication_factor
from shared.settings import Settings


class BrokerConfigs:
    """An admin client whose brokers answer a DescribeConfigs with ``value`` (or ``error_code``)."""

    def __init__(self, value: str = "3", error_code: int = 0) -> None:
        self.value = value
        self.error_code = error_code
        self.asked: list[tuple[int, str, dict[str, Any] | None]] = []

    async def describe_cluster(self) -> dict[str, Any]:
        return {"brokers": [{"node_id": 2, "host": "127.0.0.1", "port": 9192, "rack": None}]}

    async def describe_configs(self, resources: list[Any]) -> list[Any]:
        (resource,) = resources
        self.asked.append((int(resource.resource_type), resource.name, resource.configs))
        entry: tuple[Any, ...] = ("default.replication.factor", self.value, True, 4, False, [])
        entries: list[tuple[Any, ...]] = [] if self.error_code else [entry]
        message = "denied" if self.error_code else ""
        return [DescribeConfigsResponse_v2(0, [(self.error_code, message, 4, resource.name, entries)])]


@pytest.fixture(autouse=True)
def nothing_known_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_admin, "_broker_defaults", {})


async def test_a_factor_the_settings_set_wins_and_the_brokers_are_not_asked() -> None:
    admin = BrokerConfigs("3")
    assert await replication_factor(Settings(topic_replication_factor=2), admin) == 2  # type: ignore[arg-type]
    assert admin.asked == []


async def test_unset_it_is_the_brokers_default_replication_factor_asked_once() -> None:
    admin = BrokerConfigs("3")
    settings = Settings(kafka_bootstrap_servers="127.0.0.1:9092,127.0.0.1:9192")
    assert settings.topic_replication_factor is None
    assert await replication_factor(settings, admin) == 3  # type: ignore[arg-type]
    assert await replication_factor(settings, admin) == 3  # type: ignore[arg-type]
    # One question, about a broker of the cluster's metadata (4: BROKER), for the one setting.
    assert admin.asked == [(4, "2", {"default.replication.factor": None})]


async def test_brokers_that_refuse_their_configuration_get_told_what_to_set() -> None:
    admin = BrokerConfigs(error_code=31)  # CLUSTER_AUTHORIZATION_FAILED
    settings = Settings(kafka_security_protocol="SASL_SSL", kafka_sasl_username="tallies", kafka_sasl_password="x")
    with pytest.raises(BrokerAccessDenied, match=r"user 'tallies'.*set STATEFLEET_TOPIC_REPLICATION_FACTOR, or grant"):
        await replication_factor(settings, admin)  # type: ignore[arg-type]


def test_the_environment_leaves_it_unset_or_sets_a_number(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STATEFLEET_TOPIC_REPLICATION_FACTOR", raising=False)
    assert Settings().topic_replication_factor is None
    monkeypatch.setenv("STATEFLEET_TOPIC_REPLICATION_FACTOR", "3")
    assert Settings().topic_replication_factor == 3


async def test_it_is_resolved_from_synchronous_code_under_a_running_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(kafka_bootstrap_servers="127.0.0.1:9")
    monkeypatch.setattr(_admin, "_broker_defaults", {"127.0.0.1:9": 3})
    assert resolve_replication_factor(settings) == 3
    assert asyncio.get_running_loop().is_running()  # this loop left alone
