"""With no replication factor set, the fleet's topics get the brokers' default: three replicas
on the three-node cluster, for the topics a service creates and for its tables' changelogs."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from shared.engine.clients import PlainAdmin, TopicSpec, ensure_topics_async
from shared.settings import Settings
from tests.support.environment import new_topic_prefix, service_environment
from tests.support.services import ServiceProcess, wait_for_async
from tools import kafka_broker

pytestmark = pytest.mark.timeout(240)


async def replicas(bootstrap: str, names: list[str]) -> dict[str, set[int]]:
    """The replica counts of each topic's partitions (absent: the topic does not exist yet)."""
    admin = PlainAdmin(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(names)
    finally:
        await admin.close()
    return {d["topic"]: {len(p["replicas"]) for p in d["partitions"]} for d in described if d["error_code"] == 0}


async def replicas_once_listed(bootstrap: str, names: list[str]) -> dict[str, set[int]]:
    """:func:`replicas` once the metadata lists every topic of ``names`` (a broker answers
    CreateTopics once the controller has them; its metadata can be a moment behind)."""

    async def listed() -> dict[str, set[int]] | None:
        found = await replicas(bootstrap, names)
        return found if set(found) == set(names) else None

    found: dict[str, set[int]] = await wait_for_async(listed, 30, message=f"the metadata of {names}")
    return found


async def test_topics_created_without_a_factor_get_the_clusters_three_replicas(
    kafka_cluster: kafka_broker.BrokerLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STATEFLEET_TOPIC_REPLICATION_FACTOR", raising=False)
    settings = Settings(kafka_bootstrap_servers=kafka_cluster.bootstrap)
    assert settings.topic_replication_factor is None
    name = f"rf-{uuid.uuid4().hex[:8]}"
    await ensure_topics_async(settings, [TopicSpec(f"{name}.plain", 4), TopicSpec(f"{name}.compacted", 2, compacted=True)])
    assert await replicas_once_listed(kafka_cluster.bootstrap, [f"{name}.plain", f"{name}.compacted"]) == {
        f"{name}.plain": {3},
        f"{name}.compacted": {3},
    }
    # A factor the settings set still wins.
    explicit = Settings(kafka_bootstrap_servers=kafka_cluster.bootstrap, topic_replication_factor=2)
    await ensure_topics_async(explicit, [TopicSpec(f"{name}.two", 1)])
    assert await replicas_once_listed(kafka_cluster.bootstrap, [f"{name}.two"]) == {f"{name}.two": {2}}


async def test_a_service_given_only_the_bootstrap_servers_replicates_its_changelogs_three_times(
    kafka_cluster: kafka_broker.BrokerLayout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STATEFLEET_TOPIC_REPLICATION_FACTOR", raising=False)
    prefix = new_topic_prefix()  # on the three-node cluster, which goes with the test process
    env = service_environment(kafka_cluster.bootstrap, prefix, tmp_path / "data")
    tallies = ServiceProcess("tallies", env, tmp_path / "tallies.log").start()
    try:
        tallies.wait_ready(timeout=120)
        admin = PlainAdmin(bootstrap_servers=kafka_cluster.bootstrap)
        await admin.start()
        try:
            mine = sorted(t for t in await admin.list_topics() if t.startswith(prefix))
        finally:
            await admin.close()
        assert any(t.endswith("-changelog") for t in mine), f"no changelog topics among {mine}"
        assert f"{prefix}program-tallies" in mine
        # Faust's own topic, created by the engine before the worker starts.
        assert f"{prefix}statefleet-tallies-__assignor-__leader" in mine
        assert await replicas_once_listed(kafka_cluster.bootstrap, mine) == {t: {3} for t in mine}
    finally:
        tallies.stop()
