"""The in-memory topology driver itself: where records land, which records it hands over and
when, and handlers that would send to each other for ever."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.engine import Engine, InputBatch, partition_for
from shared.engine.testing import MAX_ROUNDS, TopologyDriver
from shared.settings import Settings


def engine(tmp_path: Path) -> Engine:
    return Engine("probe", Settings(data_dir=tmp_path, topic_partitions=3), 18998)


def test_records_land_by_key_or_partition_with_offsets_from_zero(tmp_path: Path) -> None:
    with TopologyDriver(engine(tmp_path), partitions={"wide": 16}) as driver:
        keyed = driver.send("wide", b"k", b"1")
        placed = driver.send("wide", b"k", b"2", partition=5)
        unkeyed = driver.send("narrow", None, b"3", timestamp_ms=42)
        again = driver.send("wide", b"k", b"4")
        assert (keyed.partition, keyed.offset) == (partition_for(b"k", 16), 0)
        assert (placed.partition, placed.offset) == (5, 0)
        assert (unkeyed.partition, unkeyed.offset, unkeyed.timestamp) == (0, 0, 42)
        assert (again.partition, again.offset) == (keyed.partition, 1)
        assert [r.value for r in driver.outputs("wide")] == [b"1", b"2", b"4"]
        assert [r.value for r in driver.outputs("wide", partition=5)] == [b"2"]


def test_what_a_handler_sends_to_a_handled_topic_is_handed_over_in_turn(tmp_path: Path) -> None:
    eng = engine(tmp_path)
    table = eng.table("counts")
    handed: list[tuple[str, bytes | None]] = []

    @eng.handler("first", name="first", offsets=table)
    async def first(batch: InputBatch) -> None:
        for record in batch.records:
            handed.append((batch.topic, record.value))
            batch.send("second", record.key, record.value)
            batch.send("elsewhere", record.key, record.value)

    @eng.handler("second", name="second", offsets=None)
    async def second(batch: InputBatch) -> None:
        handed.extend((batch.topic, record.value) for record in batch.records)

    with TopologyDriver(eng) as driver:
        driver.send("first", b"k", b"a")
        driver.send("first", b"k", b"b")
        batches = driver.process()
        assert [(b.topic, len(b.records)) for b in batches] == [("first", 2), ("second", 2)]
        assert handed == [("first", b"a"), ("first", b"b"), ("second", b"a"), ("second", b"b")]
        assert [r.value for r in driver.outputs("elsewhere")] == [b"a", b"b"]
        assert driver.process() == []  # nothing left


def test_a_stateless_handler_gets_rewound_records_again(tmp_path: Path) -> None:
    eng = engine(tmp_path)
    handed: list[int] = []

    @eng.handler("in", name="stateless", offsets=None)
    async def stateless(batch: InputBatch) -> None:
        handed.extend(record.offset for record in batch.records)

    with TopologyDriver(eng) as driver:
        driver.pipe("in", None, b"a")
        driver.pipe("in", None, b"b")
        driver.rewind("in", 0, 0)
        driver.process()
    assert handed == [0, 1, 0, 1]  # at least once: no next offsets to drop a replay by


def test_handlers_sending_to_each_other_for_ever_are_stopped(tmp_path: Path) -> None:
    eng = engine(tmp_path)
    rounds: list[int] = []

    @eng.handler("ping", name="ping", offsets=None)
    async def ping(batch: InputBatch) -> None:
        rounds.append(len(batch.records))
        batch.send("ping", None, b"again")

    with TopologyDriver(eng) as driver, pytest.raises(RuntimeError, match="sending to each other"):
        driver.pipe("ping", None, b"start")
    assert len(rounds) == MAX_ROUNDS
