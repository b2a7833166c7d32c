"""Under exactly_once the scheduler's outputs are staged on the batch, to go out in its
transaction; a record that could never be sent is left out with its reason instead of
aborting the batch on every retry. At least once, they are sent at once, one by one."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from services.retry_scheduler.app import RetrySchedulerService
from shared.engine import InputBatch, Outgoing
from shared.settings import Settings


def _service(tmp_path: Path, guarantee: str) -> RetrySchedulerService:
    return RetrySchedulerService(Settings(processing_guarantee=guarantee, data_dir=tmp_path))  # type: ignore[arg-type]


def test_exactly_once_stages_what_can_be_sent_and_reports_what_cannot(tmp_path: Path) -> None:
    service = _service(tmp_path, "exactly_once")
    assert service.engine.transactional

    async def unsendable(records: Sequence[Outgoing], timeout_s: float) -> list[str | None]:
        return ["topic 'gone' is not available" if r.topic == "gone" else None for r in records]

    service.engine.unsendable = unsendable  # type: ignore[method-assign]
    batch = InputBatch("inbox", 0, [])
    records = [
        Outgoing("retry", b"k1", b"v1", [("dlq.id", b"a")]),
        Outgoing("gone", b"k2", b"v2"),
        Outgoing("retry", None, b"v3"),
    ]
    errors = asyncio.run(service.state.send_out(batch, records))
    assert errors == [None, "topic 'gone' is not available", None]
    assert [(o.topic, o.key, o.value, o.headers) for o in batch.sends] == [
        ("retry", b"k1", b"v1", [("dlq.id", b"a")]),
        ("retry", None, b"v3", None),
    ]


def test_at_least_once_sends_at_once_and_stages_nothing(tmp_path: Path) -> None:
    service = _service(tmp_path, "at_least_once")
    assert not service.engine.transactional
    sent: list[Outgoing] = []

    async def deliver_each(records: Sequence[Outgoing], timeout_s: float) -> list[str | None]:
        sent.extend(records)
        return [None] * len(records)

    service.engine.deliver_each = deliver_each  # type: ignore[method-assign]
    batch = InputBatch("inbox", 0, [])
    assert asyncio.run(service.state.send_out(batch, [Outgoing("retry", b"k", b"v")])) == [None]
    assert [o.topic for o in sent] == ["retry"] and batch.sends == []


def test_the_setting_takes_only_the_two_guarantees() -> None:
    assert Settings().processing_guarantee == "at_least_once"
    with pytest.raises(ValueError):
        Settings(processing_guarantee="at_most_once")  # type: ignore[arg-type]
