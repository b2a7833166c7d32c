"""Topic creation goes on through the passing errors of a replicated cluster's node restarting,
and gives up at once on errors that do not pass (no broker needed: the one step it repeats is
replaced). The topics it creates are waited for until the metadata shows their leaders."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import ClusterAuthorizationFailedError, NodeNotReadyError, NotControllerError

from shared.engine import _admin
from shared.settings import Settings


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_admin, "ENSURE_TOPICS_RETRY_FIRST_S", 0.001)
    monkeypatch.setattr(_admin, "ENSURE_TOPICS_RETRY_MAX_S", 0.002)


def failing(monkeypatch: pytest.MonkeyPatch, *errors: BaseException) -> list[int]:
    """The step fails with ``errors`` in turn, then succeeds; returns the list of its calls."""
    calls: list[int] = []

    async def once(settings: Settings, specs: list[_admin.TopicSpec], group: str | None) -> None:
        calls.append(len(calls))
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]

    monkeypatch.setattr(_admin, "_ensure_topics_once", once)
    return calls


def test_passing_errors_are_waited_out(monkeypatch: pytest.MonkeyPatch, quick: None, caplog: pytest.LogCaptureFixture) -> None:
    calls = failing(monkeypatch, NodeNotReadyError("node 2 is not ready"), NotControllerError("moved"))
    asyncio.run(_admin.ensure_topics_async(Settings(), [_admin.TopicSpec("t", 1)]))
    assert len(calls) == 3
    assert "NodeNotReadyError: node 2 is not ready; trying again" in caplog.text


def test_an_error_that_does_not_pass_is_raised_at_once(monkeypatch: pytest.MonkeyPatch, quick: None) -> None:
    calls = failing(monkeypatch, ClusterAuthorizationFailedError("no"))
    with pytest.raises(ClusterAuthorizationFailedError):
        asyncio.run(_admin.ensure_topics_async(Settings(), [_admin.TopicSpec("t", 1)]))
    assert len(calls) == 1


def test_passing_errors_are_given_up_on_after_the_patience(monkeypatch: pytest.MonkeyPatch, quick: None) -> None:
    monkeypatch.setattr(_admin, "ENSURE_TOPICS_PATIENCE_S", 0.05)
    calls = failing(monkeypatch, *[NodeNotReadyError("down")] * 10_000)
    with pytest.raises(NodeNotReadyError):
        asyncio.run(_admin.ensure_topics_async(Settings(), [_admin.TopicSpec("t", 1)]))
    assert 2 <= len(calls) < 10_000


class NewTopicsAdmin:
    """An admin client whose metadata shows a leader for the topics it created only after
    ``leaderless_answers`` describe calls (the brokers' metadata a moment behind their controller)."""

    def __init__(self, existing: set[str], leaderless_answers: int) -> None:
        self.existing = set(existing)
        self.leaderless_answers = leaderless_answers
        self.described: list[list[str]] = []

    async def list_topics(self) -> list[str]:
        return sorted(self.existing)

    async def create_topics(self, topics: list[Any]) -> Any:
        self.existing.update(t.name for t in topics)
        return SimpleNamespace(topic_errors=[(t.name, 0, None) for t in topics])

    async def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        self.described.append(list(names))
        leader = -1 if len(self.described) <= self.leaderless_answers else 1
        return [{"topic": n, "error_code": 0, "partitions": [{"partition": 0, "leader": leader}]} for n in names]

    async def close(self) -> None:
        pass


def with_admin(monkeypatch: pytest.MonkeyPatch, admin: NewTopicsAdmin) -> None:
    async def started(*_: Any, **__: Any) -> NewTopicsAdmin:
        return admin

    async def one_replica(*_: Any, **__: Any) -> int:
        return 1

    monkeypatch.setattr(_admin, "started_when_reachable", started)
    monkeypatch.setattr(_admin, "replication_factor", one_replica)
    monkeypatch.setattr(_admin, "LEADERS_POLL_S", 0.001)


def test_topics_it_creates_are_waited_for_until_every_partition_has_a_leader(monkeypatch: pytest.MonkeyPatch) -> None:
    """So that the worker's first assignment, which gives out only what the metadata shows, has them."""
    admin = NewTopicsAdmin(existing={"there"}, leaderless_answers=3)
    with_admin(monkeypatch, admin)
    asyncio.run(_admin.ensure_topics_async(Settings(), [_admin.TopicSpec("there", 1), _admin.TopicSpec("new", 1)]))
    # the topic it created until it was led; then the one that was there, for its partition count
    assert admin.described == [["new"]] * 4 + [["there"]]


def test_topics_still_without_a_leader_after_the_wait_are_named_and_the_start_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    admin = NewTopicsAdmin(existing=set(), leaderless_answers=10**9)
    with_admin(monkeypatch, admin)
    monkeypatch.setattr(_admin, "LEADERS_WAIT_S", 0.02)
    asyncio.run(_admin.ensure_topics_async(Settings(), [_admin.TopicSpec("slow", 1)]))
    assert "no leader yet for partitions of slow" in caplog.text
    assert len(admin.described) >= 2


@pytest.mark.parametrize(
    ("described", "is_led"),
    [
        ({"topic": "t", "error_code": 0, "partitions": [{"leader": 1}, {"leader": 2}]}, True),
        ({"topic": "t", "error_code": 0, "partitions": [{"leader": 1}, {"leader": -1}]}, False),
        ({"topic": "t", "error_code": 0, "partitions": []}, False),
        ({"topic": "t", "error_code": 3, "partitions": []}, False),  # UNKNOWN_TOPIC_OR_PARTITION
    ],
)
def test_a_topic_is_led_when_it_has_partitions_each_with_a_leader(described: dict[str, Any], is_led: bool) -> None:
    assert _admin.led(described) is is_led
