"""A worker's clients wait for a broker that does not answer, rather than take the worker down."""

from __future__ import annotations

import pytest
from aiokafka.errors import KafkaConnectionError

from shared.engine import _clients
from shared.engine._clients import started_when_reachable


class _Client:
    def __init__(self, log: list[str], failures_left: list[int]) -> None:
        self.log, self.failures_left = log, failures_left

    async def start(self) -> None:
        if self.failures_left[0] > 0:
            self.failures_left[0] -= 1
            self.log.append("refused")
            raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 9092)]")
        self.log.append("started")

    async def stop(self) -> None:
        self.log.append("stopped")


async def test_a_client_is_started_once_the_broker_answers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_clients, "BROKER_RETRY_FIRST_S", 0.001)
    log: list[str] = []
    failures_left = [2]
    client = await started_when_reachable(lambda: _Client(log, failures_left), "producer test")
    # each refused client is stopped (its connections closed) and a new one made
    assert log == ["refused", "stopped", "refused", "stopped", "started"]
    assert client.log is log and failures_left == [0]
    assert sum("producer test: no broker answers yet" in r.getMessage() for r in caplog.records) == 2


async def test_other_errors_are_not_waited_out() -> None:
    class Broken(_Client):
        async def start(self) -> None:
            raise ValueError("bad settings")

    with pytest.raises(ValueError, match="bad settings"):
        await started_when_reachable(lambda: Broken([], [0]), "producer test")
