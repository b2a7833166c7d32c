"""A tick that cannot be sent (the broker away) is not an error of the worker: an exception
out of a timer would crash it, and the next interval sends the tick again."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from services.retry_scheduler.app import RetrySchedulerService
from shared.settings import Settings


def test_a_tick_that_cannot_be_sent_is_logged_and_sent_again_later(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    service = RetrySchedulerService(Settings(data_dir=tmp_path))
    sent: list[int | None] = []

    async def broker_away(topic: str, key: bytes | None, value: bytes | None, **kwargs: object) -> None:
        raise ConnectionError("Connect call failed ('127.0.0.1', 9092)")

    async def broker_back(topic: str, key: bytes | None, value: bytes | None, **kwargs: object) -> None:
        sent.append(kwargs.get("partition"))  # type: ignore[arg-type]

    service.engine.send = broker_away  # type: ignore[method-assign,assignment]
    with caplog.at_level(logging.WARNING):
        asyncio.run(service.ticks.ticker.send(3))
    assert 3 not in service.ticks.ticker.in_flight()  # not counted as queued: the next interval sends it
    assert "could not send the tick of inbox partition 3" in caplog.text

    service.engine.send = broker_back  # type: ignore[method-assign,assignment]
    asyncio.run(service.ticks.ticker.send(3))
    assert sent == [3] and 3 in service.ticks.ticker.in_flight()
