"""OrderedInput without Kafka: replays below the stored next offset are dropped, holes
are read back, and the next-offset rows follow the last record of each partition."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from services.validator.durable import InRecord, OrderedInput, next_offset_key, ordered_rows


@dataclass
class FakeMessage:
    topic: str
    partition: int
    offset: int
    key: bytes | None = b"k"
    value: bytes | None = b"v"
    headers: Any = ()
    timestamp: float | None = 1.0


@dataclass
class FakeEvent:
    message: FakeMessage


class FakeStore:
    def __init__(self, rows: dict[tuple[int, bytes], bytes]) -> None:
        self.rows = rows

    def get(self, partition: int, key: bytes) -> bytes | None:
        return self.rows.get((partition, key))


class FakeBackfill:
    def __init__(self, log_start: int = 0) -> None:
        self.reads: list[tuple[str, int, int, int]] = []
        self.start = log_start

    async def log_start(self, topic: str, partition: int) -> int:
        return self.start

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[InRecord]:
        self.reads.append((topic, partition, start, end))
        return [InRecord(topic, partition, o, b"k", b"back", [], 1.0) for o in range(start, end)]


def events(topic: str, partition: int, *offsets: int) -> list[FakeEvent]:
    return [FakeEvent(FakeMessage(topic, partition, o)) for o in offsets]


def run(store: dict[tuple[int, bytes], bytes], evs: list[FakeEvent], backfill: FakeBackfill | None = None) -> Any:
    backfill = backfill or FakeBackfill()
    reader = OrderedInput(app=None, store=FakeStore(store), backfill=backfill)  # type: ignore[arg-type]
    return asyncio.run(reader.batch(evs)), backfill, reader


def test_contiguous_input_passes_through_and_advances_the_offsets() -> None:
    store = {(0, next_offset_key("t")): b"5", (1, next_offset_key("t")): b"0"}
    batch, backfill, _ = run(store, events("t", 0, 5, 6, 7) + events("t", 1, 0, 1))
    assert [(r.partition, r.offset) for r in batch.records] == [(0, 5), (0, 6), (0, 7), (1, 0), (1, 1)]
    assert batch.offset_rows == {(0, next_offset_key("t")): b"8", (1, next_offset_key("t")): b"2"}
    assert backfill.reads == [] and batch.backfilled == []


def test_replays_below_the_next_offset_are_dropped() -> None:
    batch, _, reader = run({(3, next_offset_key("t")): b"10"}, events("t", 3, 7, 8, 9, 10, 11))
    assert [r.offset for r in batch.records] == [10, 11]
    assert reader.replays_dropped == 3
    assert batch.offset_rows == {(3, next_offset_key("t")): b"12"}


def test_a_hole_is_read_back_before_the_record_after_it() -> None:
    batch, backfill, reader = run({(2, next_offset_key("t")): b"218"}, events("t", 2, 218, 219, 220, 235, 236))
    assert [r.offset for r in batch.records] == [218, 219, 220, *range(221, 235), 235, 236]
    assert [r.value for r in batch.records if 221 <= r.offset < 235] == [b"back"] * 14
    assert backfill.reads == [("t", 2, 221, 235)]
    assert batch.backfilled == [("t", 2, 221, 234)]
    assert reader.records_backfilled == 14
    assert batch.offset_rows == {(2, next_offset_key("t")): b"237"}


def test_a_partition_never_seen_starts_at_the_log_start() -> None:
    batch, backfill, _ = run({}, events("t", 0, 3, 4), FakeBackfill(log_start=0))
    assert [r.offset for r in batch.records] == [0, 1, 2, 3, 4]
    assert backfill.reads == [("t", 0, 0, 3)]


def test_topics_keep_separate_offsets() -> None:
    batch, _, _ = run({(0, next_offset_key("a")): b"4"}, events("a", 0, 4) + events("b", 0, 0))
    assert batch.offset_rows == {(0, next_offset_key("a")): b"5", (0, next_offset_key("b")): b"1"}


def test_ordered_rows_put_later_parts_last() -> None:
    rows = ordered_rows([((0, b"x"), b"1"), ((0, b"off"), b"old")], [((0, b"off"), b"9")])
    assert list(rows.items()) == [((0, b"x"), b"1"), ((0, b"off"), b"9")]
