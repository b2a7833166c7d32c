"""A service many teams share: DELETE /parked/{id} through the inbox, and the actor in each history entry."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from prometheus_client import Counter

from services.retry_scheduler.app import RetrySchedulerService
from services.retry_scheduler.entries import Replayed, decode_history, encode_history
from services.retry_scheduler.handlers import routing, ticks
from services.retry_scheduler.handlers.inbox_state import now_ms
from services.retry_scheduler.handlers.kinds import KIND_DELETE_PARKED, KIND_UNPARK
from services.retry_scheduler.metrics import PARKED, PARKED_REMOVED, REDELIVERED, SCHEDULED, OriginTopicLabels
from shared.engine import partition_for
from shared.engine.testing import TopologyDriver
from shared.settings import Settings
from tests.support.dead_letters import letter_headers
from tests.unit.retry_scheduler.test_handlers import HOUR_MS, PARTITIONS, RETRY_TOPIC, tick_every_partition
from tests.unit.retry_scheduler.test_handlers import scheduler as scheduler  # the fixture: max 3 attempts, 1 h backoff


def park(service: RetrySchedulerService, driver: TopologyDriver, dlq_id: str) -> list[tuple[str, bytes]]:
    headers = letter_headers(dlq_id, RETRY_TOPIC, attempt=3)
    driver.pipe(service.topics.dead_letters, b"key", b"value", headers=headers)
    assert service.stats.parked_entry(dlq_id) is not None
    return headers


def command(service: RetrySchedulerService, driver: TopologyDriver, kind: bytes, body: dict[str, object]) -> None:
    dlq_id = str(body["id"])
    driver.pipe(service.inbox_topic_name, dlq_id.encode(), kind + orjson.dumps(body), partition=partition_for(dlq_id, PARTITIONS))


def removed(how: str) -> float:
    return float(PARKED_REMOVED.labels(how=how)._value.get())


def test_a_deleted_parked_message_is_gone_never_redelivered_and_its_copy_is_dropped(
    scheduler: tuple[RetrySchedulerService, TopologyDriver],
) -> None:
    service, driver = scheduler
    headers = park(service, driver, "d1")
    before = removed("delete")
    command(service, driver, KIND_DELETE_PARKED, {"id": "d1", "actor": "admin"})
    assert service.stats.parked_entry("d1") is None
    assert removed("delete") == before + 1
    # recorded in the history kept with the done marker, with who asked
    event = service.stats.last_event("d1", partition_for("d1", PARTITIONS))
    assert event is not None and (event.action, event.attempt, event.actor) == ("delete", 3, "admin")
    # the same dead-letter record read again (a crash before its offset was committed): dropped
    driver.pipe(service.topics.dead_letters, b"key", b"value", headers=headers)
    assert service.stats.parked_entry("d1") is None and service.stats.scheduled_entry("d1") is None
    assert driver.outputs(RETRY_TOPIC) == []


def test_deleting_what_is_not_parked_changes_nothing(scheduler: tuple[RetrySchedulerService, TopologyDriver]) -> None:
    service, driver = scheduler
    driver.pipe(service.topics.dead_letters, b"key", b"value", headers=letter_headers("s1", RETRY_TOPIC, attempt=1))
    before = removed("delete")
    command(service, driver, KIND_DELETE_PARKED, {"id": "s1", "actor": "admin"})  # scheduled, not parked
    command(service, driver, KIND_DELETE_PARKED, {"id": "nobody", "actor": "admin"})
    assert service.stats.scheduled_entry("s1") is not None
    assert removed("delete") == before


def test_an_unpark_records_its_actor_and_older_commands_without_one_record_none(
    scheduler: tuple[RetrySchedulerService, TopologyDriver],
) -> None:
    service, driver = scheduler
    park(service, driver, "d1")
    command(service, driver, KIND_UNPARK, {"id": "d1", "actor": "admin"})
    assert len(driver.outputs(RETRY_TOPIC)) == 1
    # it fails again: its next dead letter takes the history back, actor included
    driver.pipe(service.topics.dead_letters, b"key", b"value", headers=letter_headers("d1", RETRY_TOPIC, attempt=4))
    entry = service.stats.parked_entry("d1")
    assert entry is not None and [(h.action, h.actor) for h in entry.history] == [("unpark", "admin")]
    command(service, driver, KIND_UNPARK, {"id": "d1"})  # a command written before actors were
    driver.pipe(service.topics.dead_letters, b"key", b"value", headers=letter_headers("d1", RETRY_TOPIC, attempt=5))
    entry = service.stats.parked_entry("d1")
    assert entry is not None and [(h.action, h.actor) for h in entry.history] == [("unpark", "admin"), ("unpark", None)]


def test_history_with_and_without_actors_round_trips_and_old_rows_read_alike() -> None:
    events = (Replayed(10, "unpark", 2), Replayed(20, "delete", 3, "admin"))
    raw = encode_history(events)
    assert orjson.loads(raw) == [[10, "unpark", 2], [20, "delete", 3, "admin"]]  # no actor: the old three elements
    assert decode_history(raw) == events
    assert decode_history(b'[[1,"replay",1]]') == (Replayed(1, "replay", 1, None),)
    assert Replayed(1, "replay", 1).to_json() == {"at": 1, "action": "replay", "attempt": 1, "actor": None}


def test_the_retention_removes_parked_messages_older_than_it_at_a_tick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(data_dir=tmp_path, topic_partitions=PARTITIONS, retry_max_attempts=3, parked_retention_s=1800)
    service = RetrySchedulerService(settings)
    real = now_ms()
    with TopologyDriver(service.engine) as driver:
        headers = park(service, driver, "old")
        monkeypatch.setattr(routing, "now_ms", lambda: real + 2 * HOUR_MS)  # "new" is parked 2 h later
        park(service, driver, "new")
        monkeypatch.setattr(ticks, "now_ms", lambda: real + HOUR_MS)  # the tick, 1 h after "old" was parked
        before = removed("expire")
        tick_every_partition(service, driver)
        assert service.stats.parked_entry("old") is None
        assert service.stats.parked_entry("new") is not None  # parked less than the retention ago
        assert removed("expire") == before + 1 and service.retention.expired_total == 1
        event = service.stats.last_event("old", partition_for("old", PARTITIONS))
        assert event is not None and (event.action, event.actor) == ("expire", None)
        driver.pipe(service.topics.dead_letters, b"key", b"value", headers=headers)  # a copy read again: dropped
        assert service.stats.parked_entry("old") is None and service.stats.scheduled_entry("old") is None
        assert driver.outputs(RETRY_TOPIC) == []


def test_without_a_retention_parked_messages_stay(scheduler: tuple[RetrySchedulerService, TopologyDriver]) -> None:
    service, driver = scheduler
    park(service, driver, "d1")
    assert not service.retention.enabled and service.ticks.sweep_parked is None
    tick_every_partition(service, driver)
    assert service.stats.parked_entry("d1") is not None


def test_origin_topic_labels_are_bounded_to_the_most_frequent_topics_plus_other() -> None:
    labels = OriginTopicLabels(max_topics=2)
    assert [labels.label(t) for t in ("a", "b", "c", "a")] == ["a", "b", "other", "a"]
    # "c" becomes more than twice as frequent as "b" (the least seen labelled topic): it takes its place
    assert [labels.label("c") for _ in range(2)] == ["other", "c"]
    assert labels.label("b") == "other" and set(labels.seen) == {"a", "c"}
    # many rare topics: memory stays bounded (4 x max_topics candidates), all counted as other
    assert {labels.label(f"rare-{i}") for i in range(1000)} == {"other"}
    assert len(labels.candidates) <= 8 and len(labels.seen) == 2
    assert OriginTopicLabels(max_topics=0).label("a") == "other"
    # events counted together (a batch's) weigh as many events one by one
    batched = OriginTopicLabels(max_topics=1)
    assert (batched.label("a", 3), batched.label("b", 6), batched.label("b", 1)) == ("a", "other", "b")
    assert batched.seen == {"b": 7}


def test_the_counters_carry_the_origin_topic(scheduler: tuple[RetrySchedulerService, TopologyDriver]) -> None:
    service, driver = scheduler
    topic = "orders"  # letter_headers' default origin topic

    def value(counter: Counter, *labels: str) -> float:
        return float(counter.labels(*labels)._value.get())

    scheduled, parked = value(SCHEDULED, topic), value(PARKED, topic)
    driver.pipe(service.topics.dead_letters, b"key", b"value", headers=letter_headers("m1", RETRY_TOPIC, attempt=1))
    park(service, driver, "m2")
    assert value(SCHEDULED, topic) == scheduled + 1 and value(PARKED, topic) == parked + 1
    unparked = value(REDELIVERED, "unpark", topic)
    command(service, driver, KIND_UNPARK, {"id": "m2", "actor": "admin"})
    assert value(REDELIVERED, "unpark", topic) == unparked + 1
