"""Topic creation goes on through the passing errors of a replicated cluster's node restarting,
and gives up at once on errors that do not pass (no broker needed: the one step it repeats is
replaced)."""

from __future__ import annotations

import asyncio

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
