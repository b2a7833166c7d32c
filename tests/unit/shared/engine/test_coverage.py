"""An assignment that skipped a topic for want of metadata is made again once the topic is known,
and an instance is not ready while an input topic has no owner in the group."""

from __future__ import annotations

import asyncio
import json
import zlib
from typing import Any

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
from faust.assignor.client_assignment import ClientAssignment, ClientMetadata

from shared.engine import _coverage
from shared.engine._coverage import MetadataChase, ready, unowned_input_topics
from shared.engine._warmup import WarmupAssignor

PARTITIONS = 8
SOURCE = "account-events"


class Cluster:
    """Cluster metadata in which ``missing`` topics have no partitions (yet)."""

    def __init__(self, missing: set[str]) -> None:
        self.missing = missing

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return None if topic in self.missing else set(range(PARTITIONS))


def join(assignor: WarmupAssignor, url: str) -> ConsumerProtocolMemberMetadata:
    changelog = next(iter(assignor.changelog_topics))
    meta = ClientMetadata(
        assignment=ClientAssignment(actives={}, standbys={}),
        url=url,
        changelog_distribution={},
        external_topic_distribution={},
        topic_groups={},
    )
    return ConsumerProtocolMemberMetadata(4, [SOURCE, changelog], meta.dumps())


def actives(assignment: Any) -> dict[str, list[int]]:
    return dict(json.loads(zlib.decompress(assignment.user_data))["assignment"]["actives"])


def test_an_assignment_that_skips_a_topic_without_metadata_chases_it(assignor: WarmupAssignor) -> None:
    members = {"m-a": join(assignor, "http://a"), "m-b": join(assignor, "http://b")}
    out = assignor.assign(Cluster({SOURCE}), members)  # type: ignore[arg-type]
    # Faust's assignor gives nobody the topic it cannot see...
    assert all(not actives(a).get(SOURCE) for a in out.values())
    # ...so the leader keeps asking for its metadata.
    assert assignor.metadata_chase.topics == {SOURCE}

    out = assignor.assign(Cluster(set()), members)  # type: ignore[arg-type]
    assert sorted(p for a in out.values() for p in actives(a)[SOURCE]) == list(range(PARTITIONS))
    assert assignor.metadata_chase.topics == set()


class Client:
    def __init__(self, known_after: int) -> None:
        self.refreshes = 0
        self.known_after = known_after
        self.cluster = self

    async def force_metadata_update(self) -> bool:
        self.refreshes += 1
        return True

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(range(PARTITIONS)) if self.refreshes >= self.known_after else None


class Coordinator:
    def __init__(self, client: Client) -> None:
        self._client = client
        self.rejoins = 0

    def request_rejoin(self) -> None:
        self.rejoins += 1


async def test_the_chase_refreshes_metadata_until_the_topic_is_known_then_rejoins(monkeypatch: pytest.MonkeyPatch) -> None:
    coordinator = Coordinator(Client(known_after=3))
    monkeypatch.setattr(_coverage, "consumer_coordinator", lambda app: coordinator)
    monkeypatch.setattr(_coverage, "CHASE_FIRST_WAIT_S", 0.001)
    chase = MetadataChase(app=None)  # type: ignore[arg-type]
    chase.start([SOURCE])
    assert chase._task is not None
    await asyncio.wait_for(chase._task, 5)
    assert coordinator._client.refreshes == 3 and coordinator.rejoins == 1
    assert chase.topics == set()


async def test_nothing_skipped_starts_no_chase() -> None:
    chase = MetadataChase(app=None)  # type: ignore[arg-type]
    chase.start([])
    assert chase._task is None


class App:
    def __init__(self, distribution: dict[str, dict[str, list[int]]], input_topics: set[str]) -> None:
        self.assignor = type("Assignor", (), {"changelog_distribution": {}, "external_topic_distribution": distribution})()
        self.input_topics = frozenset(input_topics)


def test_input_topics_without_an_owner_in_the_group_are_told_and_readiness_is_about_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_coverage, "recovery_done", lambda app: True)
    # This instance owns nothing (more instances than partitions): another owns everything.
    covered = App({"http://a": {}, "http://b": {"logins": [0, 1], "events": [0]}}, {"logins", "events"})
    assert unowned_input_topics(covered) == set()  # type: ignore[arg-type]
    skipped = App({"http://a": {"logins": []}, "http://b": {"logins": [0, 1]}}, {"logins", "events"})
    assert unowned_input_topics(skipped) == {"events"}  # type: ignore[arg-type]
    # Ready all the same: what it holds is restored, and it answers from it.
    assert ready(skipped)  # type: ignore[arg-type]
