"""The offsets of processed batches: committed by the worker consumer's commit (Faust's periodic
one, the revocation's, the stop's) under at_least_once, each new offset once and only for an
assigned partition; left to the batches' transactions under exactly_once (see
``shared/engine/_consumer.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from faust.types import TP

from shared.engine import Engine
from shared.engine._consumer import BatchConsumer
from shared.settings import Settings

ASSIGNED = {TP("in", 0), TP("in", 1), TP("other", 0)}


def worker_consumer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, guarantee: str) -> tuple[BatchConsumer, list[dict[TP, int]]]:
    """The engine's worker consumer, not started: its thread's commit noted, not sent."""
    engine = Engine("commits", Settings(data_dir=str(tmp_path), processing_guarantee=guarantee, topic_prefix="unit."), 18999)
    consumer = engine._faust_app.consumer
    assert isinstance(consumer, BatchConsumer)
    sent: list[dict[TP, int]] = []

    async def commit(offsets: dict[TP, int]) -> bool:
        sent.append(dict(offsets))
        return True

    async def flush() -> None:
        return None

    monkeypatch.setattr(consumer.thread, "commit", commit)
    monkeypatch.setattr(consumer, "assignment", lambda: ASSIGNED)
    monkeypatch.setattr(cast(Any, consumer.app).producer, "flush", flush)
    return consumer, sent


async def test_each_processed_offset_is_committed_once_for_assigned_partitions_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    consumer, sent = worker_consumer(tmp_path, monkeypatch, "at_least_once")
    consumer._processed.update({TP("in", 0): 10, TP("in", 1): 5, TP("revoked", 0): 3})
    assert await consumer.commit()
    assert sent == [{TP("in", 0): 10, TP("in", 1): 5}]
    assert not await consumer.commit()  # nothing new since
    assert sent == [{TP("in", 0): 10, TP("in", 1): 5}]
    consumer._processed.update({TP("in", 1): 8, TP("other", 0): 4})
    assert await consumer.commit({"in"})  # a commit of some topics (or partitions) only
    assert sent[-1] == {TP("in", 1): 8}
    assert await consumer.commit({TP("other", 0)})
    assert sent[-1] == {TP("other", 0): 4}


async def test_an_offset_the_consumer_sought_to_is_not_committed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    consumer, sent = worker_consumer(tmp_path, monkeypatch, "at_least_once")
    consumer._committed[TP("in", 0)] = 10  # the group's committed offset, as the last seek found it
    consumer._processed.update({TP("in", 0): 10, TP("in", 1): 5})
    assert await consumer.commit()
    assert sent == [{TP("in", 1): 5}]


async def test_under_exactly_once_the_batches_transactions_commit_and_the_consumer_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    consumer, sent = worker_consumer(tmp_path, monkeypatch, "exactly_once")
    consumer._processed.update({TP("in", 0): 10, TP("in", 1): 5})
    assert not await consumer.commit()
    assert sent == []
