"""TrailingHoleWatch without Kafka: it seeks back only when the consumer is past records the
handler never processed, none of them is in the stream, and a second check saw the same."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from faust.types import TP

from shared.engine._trailing_holes import TrailingHoleWatch

EVENTS = TP("events", 0)
OTHER = TP("other", 0)


@dataclass
class FakeConsumer:
    positions: dict[TP, int]
    unacked: list[Any] = field(default_factory=list)
    seeks: list[dict[TP, int]] = field(default_factory=list)

    def assignment(self) -> set[TP]:
        return set(self.positions)

    async def position(self, tp: TP) -> int:
        return self.positions[tp]

    async def seek_wait(self, partitions: dict[TP, int]) -> None:
        self.seeks.append(dict(partitions))
        self.positions.update(partitions)


@dataclass
class FakeInput:
    offsets: dict[tuple[str, int], int]
    #: Ranges that hold no committed record (exactly_once); empty: reading uncommitted records.
    empty: set[tuple[str, int, int, int]] = field(default_factory=set)
    confirmed: list[tuple[str, int, int, int]] = field(default_factory=list)

    def settled_offset(self, topic: str, partition: int) -> int | None:
        return self.offsets.get((topic, partition))

    async def confirm_empty(self, topic: str, partition: int, start: int, end: int) -> bool:
        self.confirmed.append((topic, partition, start, end))
        return (topic, partition, start, end) in self.empty


def fake_app(consumer: FakeConsumer, recovered: bool = True) -> Any:
    completed = SimpleNamespace(is_set=lambda: recovered)
    return SimpleNamespace(
        consumer=consumer,
        rebalancing=False,
        timer=lambda interval, name: lambda fun: fun,
        tables=SimpleNamespace(recovery=SimpleNamespace(completed=completed, in_recovery=False)),
    )


def checks(watch: TrailingHoleWatch, n: int) -> None:
    async def run() -> None:
        for _ in range(n):
            await watch.check()

    asyncio.run(run())


def test_a_hole_seen_twice_sends_the_consumer_back_to_the_expected_offset() -> None:
    consumer = FakeConsumer({EVENTS: 12, OTHER: 40})
    reader = FakeInput({("events", 0): 10, ("other", 0): 5})
    watch = TrailingHoleWatch(fake_app(consumer), "svc", {"events": reader}, 5.0)  # "other" is not an input
    checks(watch, 1)
    assert consumer.seeks == []  # first sighting: the records may still be on their way
    checks(watch, 1)
    assert consumer.seeks == [{EVENTS: 10}] and watch.rereads == 1
    checks(watch, 2)  # back at the expected offset: nothing more to do
    assert consumer.seeks == [{EVENTS: 10}]


def test_progress_between_checks_is_not_a_hole() -> None:
    consumer = FakeConsumer({EVENTS: 12})
    reader = FakeInput({("events", 0): 10})
    watch = TrailingHoleWatch(fake_app(consumer), "svc", {"events": reader}, 5.0)
    checks(watch, 1)
    reader.offsets[("events", 0)] = 11  # the handler processed one meanwhile
    checks(watch, 1)
    assert consumer.seeks == []


def test_records_still_in_the_stream_or_a_recovery_are_left_alone() -> None:
    consumer = FakeConsumer({EVENTS: 12}, unacked=[SimpleNamespace(tp=EVENTS)])
    watch = TrailingHoleWatch(fake_app(consumer), "svc", {"events": FakeInput({("events", 0): 10})}, 5.0)
    checks(watch, 3)
    assert consumer.seeks == []

    recovering = FakeConsumer({EVENTS: 12})
    watch = TrailingHoleWatch(fake_app(recovering, recovered=False), "svc", {"events": FakeInput({("events", 0): 10})}, 5.0)
    checks(watch, 3)
    assert recovering.seeks == []


def test_an_input_with_nothing_processed_yet_is_left_to_the_stream() -> None:
    consumer = FakeConsumer({EVENTS: 12})
    watch = TrailingHoleWatch(fake_app(consumer), "svc", {"events": FakeInput({})}, 5.0)
    checks(watch, 3)
    assert consumer.seeks == []


def test_a_range_holding_only_a_transaction_marker_is_not_sought_back_to() -> None:
    # exactly_once: the consumer's position is one past the handler's next offset after every
    # transaction (its commit marker); once read back and found empty, it is no hole.
    consumer = FakeConsumer({EVENTS: 11})
    reader = FakeInput({("events", 0): 10}, empty={("events", 0, 10, 11)})
    watch = TrailingHoleWatch(fake_app(consumer), "svc", {"events": reader}, 5.0)
    checks(watch, 4)
    assert consumer.seeks == [] and watch.rereads == 0
    assert reader.confirmed[0] == ("events", 0, 10, 11)


def test_a_range_with_records_is_still_sought_back_to_under_read_committed() -> None:
    consumer = FakeConsumer({EVENTS: 12})
    reader = FakeInput({("events", 0): 10}, empty={("events", 0, 10, 11)})  # 11 holds a record
    watch = TrailingHoleWatch(fake_app(consumer), "svc", {"events": reader}, 5.0)
    checks(watch, 2)
    assert consumer.seeks == [{EVENTS: 10}] and watch.rereads == 1
