"""The consumer lag gauge: per input topic, the records of its assigned partitions after the
last one handed on, set on a timer from what the consumer already knows (see
``shared/engine/_consumer.py``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from faust.types import TP
from mode.services import ServiceTask

from shared.engine._consumer import LAG_EVERY_S, BatchConsumer, lag_by_topic
from shared.metrics import REGISTRY


def lag_gauge(service: str, topic: str) -> float | None:
    return REGISTRY.get_sample_value("statefleet_consumer_lag_records", {"service": service, "topic": topic})


def test_lag_sums_each_topics_assigned_partitions() -> None:
    ends = {TP("in", 0): 100, TP("in", 1): 50, TP("other", 0): 10}
    last = {TP("in", 0): 89, TP("in", 1): 49, TP("other", 0): 0}
    lags = lag_by_topic(["in", "other"], ends, ends.get, last.get)
    assert lags == {"in": 10, "other": 9}


def test_unknown_offsets_and_unassigned_topics_count_zero() -> None:
    ends: dict[TP, int | None] = {TP("in", 0): None, TP("in", 1): 30, TP("not-an-input", 0): 1000}
    last: dict[TP, int | None] = {TP("in", 1): None}
    assert lag_by_topic(["in", "idle"], ends, ends.get, last.get) == {"in": 0, "idle": 0}


def test_a_position_past_the_high_watermark_is_no_lag() -> None:
    # the high watermark is the one the consumer last fetched; records handed on since can pass it
    assert lag_by_topic(["in"], [TP("in", 0)], lambda tp: 5, lambda tp: 9) == {"in": 0}


def fake_consumer(service: str, assigned: set[TP], ends: dict[TP, int], last: dict[TP, int | None]) -> Any:
    return SimpleNamespace(
        delivery=SimpleNamespace(service=service, batch_topics=frozenset({"orders", "payments"})),
        assignment=lambda: assigned,
        read_offsets=last,
        _highwater=ends.get,
    )


def test_record_lag_sets_the_gauge_per_input_topic() -> None:
    tps = {TP("orders", 0), TP("orders", 1), TP("payments", 3)}
    ends = {TP("orders", 0): 1_000, TP("orders", 1): 200, TP("payments", 3): 7}
    last: dict[TP, int | None] = {TP("orders", 0): 899, TP("orders", 1): 199, TP("payments", 3): 6}
    BatchConsumer.record_lag(fake_consumer("lagtest", tps, ends, last))
    assert lag_gauge("lagtest", "orders") == 100
    assert lag_gauge("lagtest", "payments") == 0
    # partitions revoked: their topic's lag goes back to 0 at the next tick
    BatchConsumer.record_lag(fake_consumer("lagtest", {TP("payments", 3)}, ends, last))
    assert lag_gauge("lagtest", "orders") == 0


def test_no_service_or_no_running_consumer_sets_nothing() -> None:
    BatchConsumer.record_lag(fake_consumer("", {TP("orders", 0)}, {TP("orders", 0): 10}, {TP("orders", 0): 0}))
    assert lag_gauge("", "orders") is None

    def not_running() -> set[TP]:
        raise RuntimeError("consumer thread not started")

    fake = fake_consumer("lag-stopped", set(), {}, {})
    fake.assignment = not_running
    BatchConsumer.record_lag(fake)
    assert lag_gauge("lag-stopped", "orders") is None


def test_the_gauge_is_set_on_a_timer_of_the_consumer_service() -> None:
    task = vars(BatchConsumer)["_lag_timer"]
    assert isinstance(task, ServiceTask)
    assert "_lag_timer" in (BatchConsumer._tasks or {})[BatchConsumer._get_class_id()]
    assert 1.0 <= LAG_EVERY_S <= 15.0  # fresher than a scrape interval, never per record


def test_a_high_watermark_the_consumer_cannot_give_is_unknown() -> None:
    def highwater(tp: TP) -> int:
        raise AssertionError("partition not assigned")

    def consumer(highwater: Any) -> Any:
        return SimpleNamespace(highwater=highwater)

    assert BatchConsumer._highwater(consumer(highwater), TP("in", 0)) is None
    assert BatchConsumer._highwater(consumer(lambda tp: None), TP("in", 0)) is None
    assert BatchConsumer._highwater(consumer(lambda tp: 42), TP("in", 0)) == 42
