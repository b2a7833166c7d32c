from __future__ import annotations

import pytest

from shared.dead_letters import parse_dead_letter
from spark_jobs.replay_selection import ReplayFilter, origin_names, replay_for

pytestmark = pytest.mark.spark


def parked(**headers: str):  # type: ignore[no-untyped-def]
    raw = [("own", b"x")] + [(k.replace("_", "."), v.encode()) for k, v in headers.items()]
    return parse_dead_letter(b"k", b"v", raw, topic="pl", partition=1, offset=7, timestamp_ms=500, default_retry_topic="p.retry")


DL = parked(
    dlq_id="id1",
    dlq_original_topic="p.logins",
    dlq_error_class="TimeoutError",
    dlq_attempt="5",
    dlq_failed_at="2000",
    dlq_first_failed_at="1000",
    dlq_retry_topic="p.retry-tallies",
)


@pytest.mark.parametrize(
    ("filters", "selected"),
    [
        (ReplayFilter(), True),
        (ReplayFilter(origin_topics=frozenset({"p.logins"})), True),
        (ReplayFilter(origin_topics=frozenset({"p.account-events"})), False),
        (ReplayFilter(error_classes=frozenset({"TimeoutError", "KeyError"})), True),
        (ReplayFilter(error_classes=frozenset({"KeyError"})), False),
        (ReplayFilter(since_ms=2000), True),
        (ReplayFilter(since_ms=2001), False),
        (ReplayFilter(until_ms=2000), False),
        (ReplayFilter(until_ms=2001), True),
        (ReplayFilter(origin_topics=frozenset({"p.logins"}), error_classes=frozenset({"KeyError"})), False),
    ],
)
def test_filters(filters: ReplayFilter, selected: bool) -> None:
    assert filters.matches(DL) is selected


def test_origin_names_accept_names_without_the_prefix() -> None:
    assert origin_names(["logins", "p.retry"], "p.") == frozenset({"logins", "p.logins", "p.retry"})
    assert origin_names(["logins"], "") == frozenset({"logins"})


def test_replay_to_dead_letters_resets_the_attempt_and_keeps_the_rest() -> None:
    replay = replay_for(DL, "dead-letters", "p.dead-letters", "run-1", "pl:1:7")
    assert replay.target_topic == "p.dead-letters"
    assert replay.headers == [
        ("own", b"x"),
        ("dlq.id", b"id1"),
        ("dlq.original.topic", b"p.logins"),
        ("dlq.original.partition", b"1"),
        ("dlq.original.offset", b"7"),
        ("dlq.retry.topic", b"p.retry-tallies"),
        ("dlq.attempt", b"1"),
        ("dlq.error.class", b"TimeoutError"),
        ("dlq.error.message", b""),
        ("dlq.first.failed.at", b"1000"),
        ("dlq.failed.at", b"2000"),
        ("statefleet.replay.run", b"run-1"),
        ("statefleet.replay.source", b"pl:1:7"),
    ]


def test_replay_to_retry_uses_the_message_retry_topic_and_replaces_old_replay_headers() -> None:
    again = parse_dead_letter(
        b"k",
        b"v",
        [*DL.headers(), ("statefleet.replay.run", b"old"), ("statefleet.replay.source", b"pl:0:1")],
        topic="pl",
        partition=2,
        offset=9,
        timestamp_ms=1,
        default_retry_topic="p.retry",
    )
    replay = replay_for(again, "retry", "p.dead-letters", "run-2", "pl:2:9")
    assert replay.target_topic == "p.retry-tallies"
    replay_headers = [(k, v) for k, v in replay.headers if k.startswith("statefleet.")]
    assert replay_headers == [("statefleet.replay.run", b"run-2"), ("statefleet.replay.source", b"pl:2:9")]
    assert dict(replay.headers)["dlq.attempt"] == b"1"
