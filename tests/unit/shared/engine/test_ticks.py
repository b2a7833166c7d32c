"""Tick records for timers' work in handlers: one in flight per partition, sent again once the
handler took it (or after ten intervals), and one that cannot be sent goes with the next interval."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from shared.engine._ticks import Ticker


class Broker:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, int]] = []
        self.away = False

    async def send(self, topic: str, key: bytes | None, value: bytes | None, *, partition: int, **_: Any) -> None:
        if self.away:
            raise ConnectionError("Connect call failed")
        self.sent.append((topic, value, partition))


def ticker(broker: Broker, interval_s: float = 1.0, clock: list[float] | None = None) -> Ticker:
    now = clock if clock is not None else [0.0]
    return Ticker(lambda: broker.send, "inbox", b"tick", interval_s=interval_s, name="tick of inbox", clock=lambda: now[0])


def test_one_tick_in_flight_per_partition_until_the_handler_takes_it() -> None:
    broker = Broker()
    ticks = ticker(broker)
    asyncio.run(ticks.send_to([2, 0]))
    asyncio.run(ticks.send_to([0, 1, 2]))
    assert [p for _, _, p in broker.sent] == [0, 2, 1]  # in order, and none twice
    assert all(value == b"tick" for _, value, _ in broker.sent) and ticks.in_flight() == {0, 1, 2}
    ticks.taken(0)
    asyncio.run(ticks.send_to([0, 1, 2]))
    assert [p for _, _, p in broker.sent] == [0, 2, 1, 0]


def test_a_tick_lost_is_sent_again_after_ten_intervals_or_after_a_rebalance() -> None:
    broker = Broker()
    clock = [100.0]
    ticks = ticker(broker, interval_s=1.0, clock=clock)
    asyncio.run(ticks.send_to([4]))
    clock[0] += 9.9
    asyncio.run(ticks.send_to([4]))
    assert len(broker.sent) == 1
    clock[0] += 0.2
    asyncio.run(ticks.send_to([4]))
    assert len(broker.sent) == 2
    ticks.forget()
    asyncio.run(ticks.send_to([4]))
    assert len(broker.sent) == 3


def test_a_tick_staged_by_the_handler_counts_as_in_flight() -> None:
    broker = Broker()
    ticks = ticker(broker)
    ticks.staged(5)
    asyncio.run(ticks.send_to([5]))
    assert broker.sent == [] and ticks.in_flight() == {5}


def test_a_tick_that_cannot_be_sent_goes_with_the_next_interval(caplog: pytest.LogCaptureFixture) -> None:
    broker = Broker()
    broker.away = True
    ticks = ticker(broker)
    with caplog.at_level(logging.WARNING, logger="shared.engine._ticks"):
        asyncio.run(ticks.send_to([3]))
    assert ticks.in_flight() == set()
    assert "could not send the tick of inbox partition 3 (sent again in 1.0s): ConnectionError" in caplog.text
    broker.away = False
    asyncio.run(ticks.send_to([3]))
    assert broker.sent == [("inbox", b"tick", 3)] and ticks.in_flight() == {3}
