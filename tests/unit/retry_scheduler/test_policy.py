"""The backoff policy: bounds, jitter ranges, caps, determinism, overrides, decisions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.retry_scheduler.domain import (
    MAX_DUE_MS,
    NEVER_RETRIED,
    Park,
    Policy,
    PolicyBook,
    PolicyError,
    Schedule,
    build_policy_book,
    decide,
    due_time,
    jitter_fraction,
    merge_headers,
    parse_overrides,
    percentile,
    retry_topic_problem,
)

ids = st.text(min_size=1, max_size=40)
attempts = st.integers(min_value=1, max_value=200)


def test_cap_doubles_from_the_base_and_stops_at_the_max() -> None:
    p = Policy(base_delay_ms=1000, max_delay_ms=10_000, jitter="none")
    assert [p.cap_ms(a) for a in range(1, 7)] == [1000, 2000, 4000, 8000, 10_000, 10_000]
    assert p.cap_ms(10_000) == 10_000  # no overflow for absurd attempt numbers


def test_no_jitter_is_exactly_the_cap() -> None:
    p = Policy(base_delay_ms=250, max_delay_ms=60_000, jitter="none")
    assert p.delay_ms("x", 3) == 1000
    assert p.delay_bounds(3) == (1000, 1000)


@given(ids, attempts, st.integers(0, 100_000), st.integers(0, 10_000_000))
def test_full_jitter_stays_within_zero_and_the_cap(dlq_id: str, attempt: int, base: int, cap: int) -> None:
    p = Policy(base_delay_ms=base, max_delay_ms=cap, jitter="full")
    lo, hi = p.delay_bounds(attempt)
    assert (lo, hi) == (0, p.cap_ms(attempt))
    assert lo <= p.delay_ms(dlq_id, attempt) <= hi


@given(ids, attempts, st.integers(0, 100_000), st.integers(0, 10_000_000))
def test_equal_jitter_stays_within_half_and_the_cap(dlq_id: str, attempt: int, base: int, cap: int) -> None:
    p = Policy(base_delay_ms=base, max_delay_ms=cap, jitter="equal")
    lo, hi = p.delay_bounds(attempt)
    assert (lo, hi) == (p.cap_ms(attempt) // 2, p.cap_ms(attempt))
    assert lo <= p.delay_ms(dlq_id, attempt) <= hi


@given(ids, attempts)
def test_jitter_is_a_function_of_id_and_attempt(dlq_id: str, attempt: int) -> None:
    f = jitter_fraction(dlq_id, attempt)
    assert 0.0 <= f < 1.0
    assert jitter_fraction(dlq_id, attempt) == f
    p = Policy(base_delay_ms=1000, max_delay_ms=1_000_000, jitter="full")
    assert p.delay_ms(dlq_id, attempt) == p.delay_ms(dlq_id, attempt)


def test_jitter_spreads_over_the_whole_range() -> None:
    p = Policy(base_delay_ms=1000, max_delay_ms=1000, jitter="full")
    delays = [p.delay_ms(f"id-{i}", 1) for i in range(2000)]
    assert min(delays) < 50 and max(delays) > 950
    assert 400 < sum(delays) / len(delays) < 600  # uniform: mean near half the cap
    equal = Policy(base_delay_ms=1000, max_delay_ms=1000, jitter="equal")
    e = [equal.delay_ms(f"id-{i}", 1) for i in range(2000)]
    assert min(e) >= 500 and min(e) < 550 and max(e) > 950


def test_due_time_counts_from_failed_at_but_never_from_the_future() -> None:
    p = Policy(base_delay_ms=1000, max_delay_ms=1000, jitter="none")
    assert due_time(p, "a", 1, failed_at=5_000, now_ms=9_000) == 6_000
    assert due_time(p, "a", 1, failed_at=50_000, now_ms=9_000) == 10_000
    assert due_time(p, "a", 1, failed_at=-7, now_ms=9_000) == 1_000
    huge = Policy(base_delay_ms=MAX_DUE_MS, max_delay_ms=MAX_DUE_MS, jitter="none")
    assert due_time(huge, "a", 1, failed_at=9_000, now_ms=9_000) == MAX_DUE_MS


def book_with(overrides: str, jitter: str, topic_prefix: str) -> PolicyBook:
    """Defaults of 5 attempts, 1 s base and 60 s cap, with ``overrides``."""
    return build_policy_book(
        max_attempts=5, base_delay_ms=1000, max_delay_ms=60_000, jitter=jitter, overrides=overrides, topic_prefix=topic_prefix
    )


def test_overrides_apply_topic_then_error_class_over_the_defaults() -> None:
    book = book_with(
        '{"origin_topic": {"orders": {"max_attempts": 8, "base_delay_ms": 10}},'
        ' "error_class": {"Timeout": {"base_delay_ms": 50, "jitter": "none"}}}',
        "equal",
        "t1.",
    )
    assert book.policy_for("other", "Boom") == Policy(5, 1000, 60_000, "equal")
    # matched with and without the topic prefix
    assert book.policy_for("orders", "Boom") == Policy(8, 10, 60_000, "equal")
    assert book.policy_for("t1.orders", "Boom") == Policy(8, 10, 60_000, "equal")
    # error class fields win over the topic's; the topic's other fields stay
    assert book.policy_for("t1.orders", "Timeout") == Policy(8, 50, 60_000, "none")
    assert book.policy_for("x", "ValidationError").max_attempts == 1


def test_configured_error_class_overrides_merge_over_the_built_in_ones() -> None:
    book = build_policy_book(
        max_attempts=5,
        base_delay_ms=1000,
        max_delay_ms=60_000,
        jitter="full",
        overrides='{"error_class": {"DecodeError": {"max_attempts": 3}}}',
    )
    assert book.policy_for("x", "DecodeError").max_attempts == 3
    assert book.policy_for("x", "InvalidInput").max_attempts == 1
    assert set(NEVER_RETRIED) <= set(book.by_error_class)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1]", "must be a JSON object"),
        ("{nope", "not valid JSON"),
        ('{"topics": {}}', "unknown sections"),
        ('{"origin_topic": []}', "expected an object"),
        ('{"origin_topic": {"a": {"max_attempts": 0}}}', "max_attempts: must be an integer >= 1"),
        ('{"origin_topic": {"a": {"base_delay_ms": -1}}}', "base_delay_ms: must be an integer >= 0"),
        ('{"origin_topic": {"a": {"base_delay_ms": true}}}', "must be an integer"),
        ('{"error_class": {"E": {"jitter": "half"}}}', "jitter: must be one of"),
        ('{"origin_topic": {"a": {"redeliver_to": "elsewhere"}}}', "redeliver_to: must be one of"),
        ('{"error_class": {"E": {"delay": 1}}}', "unknown fields"),
        ('{"error_class": {"E": 3}}', "expected an object of policy fields"),
    ],
)
def test_bad_overrides_are_refused_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_overrides(text)


def test_empty_overrides_are_none() -> None:
    assert parse_overrides("") == ({}, {})
    assert parse_overrides("  ") == ({}, {})


def test_decide_schedules_until_max_attempts_then_parks() -> None:
    book = PolicyBook(default=Policy(max_attempts=3, base_delay_ms=100, max_delay_ms=10_000, jitter="none"))
    common = {"dlq_id": "a", "origin_topic": "orders", "error_class": "Boom", "retry_topic": "retry", "now_ms": 1000}
    assert decide(book, attempt=1, failed_at=1000, **common) == Schedule(1100, book.default)  # type: ignore[arg-type]
    assert decide(book, attempt=2, failed_at=1000, **common) == Schedule(1200, book.default)  # type: ignore[arg-type]
    parked = decide(book, attempt=3, failed_at=1000, **common)  # type: ignore[arg-type]
    assert isinstance(parked, Park) and parked.reason == "attempt 3 reached max_attempts 3"
    never = decide(book, attempt=1, failed_at=1000, **{**common, "error_class": "ValidationError"})  # type: ignore[arg-type]
    assert isinstance(never, Park) and "is not retried" in never.reason


def test_decide_parks_messages_that_cannot_be_redelivered() -> None:
    book = PolicyBook()
    common = {"dlq_id": "a", "attempt": 1, "origin_topic": "o", "error_class": "E", "failed_at": 0, "now_ms": 0}
    bad = decide(book, retry_topic="no spaces allowed", **common)  # type: ignore[arg-type]
    assert isinstance(bad, Park) and "not a valid Kafka topic name" in bad.reason
    loop = decide(book, retry_topic="dead-letters", forbidden_retry_topics=frozenset({"dead-letters"}), **common)  # type: ignore[arg-type]
    assert isinstance(loop, Park) and "loop" in loop.reason
    empty = decide(book, retry_topic="retry", has_key_or_value=False, **common)  # type: ignore[arg-type]
    assert isinstance(empty, Park) and "neither key nor value" in empty.reason


@pytest.mark.parametrize(
    ("topic", "ok"),
    [
        ("retry", True),
        ("t1.retry-tallies", True),
        ("a" * 249, True),
        ("a" * 250, False),
        ("", False),
        (".", False),
        ("..", False),
        ("x/y", False),
        ("é", False),
    ],
)
def test_retry_topic_names(topic: str, ok: bool) -> None:
    assert (retry_topic_problem(topic) is None) is ok


def test_merge_headers_keeps_every_header_in_place_and_fills_missing_dlq_ones() -> None:
    raw = [("trace", b"1"), ("dlq.attempt", b"2"), ("dlq.custom", b"c"), ("dlq.attempt", b"9"), ("x", b"")]
    normalized = [("dlq.id", b"id"), ("dlq.attempt", b"2"), ("dlq.retry.topic", b"retry")]
    assert merge_headers(raw, normalized) == [
        ("trace", b"1"),
        ("dlq.attempt", b"2"),
        ("dlq.custom", b"c"),
        ("x", b""),
        ("dlq.id", b"id"),
        ("dlq.retry.topic", b"retry"),
    ]


def test_percentile_is_nearest_rank() -> None:
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([7], 99) == 7
    assert percentile([], 50) is None


def test_a_letter_without_a_retry_topic_goes_where_its_origin_topics_policy_says() -> None:
    book = book_with('{"origin_topic": {"payments": {"redeliver_to": "origin"}}}', "none", "p.")
    assert book.policy_for("p.payments", "E").retry_topic("p.payments", "p.retry") == "p.payments"
    assert book.policy_for("p.orders", "E").retry_topic("p.orders", "p.retry") == "p.retry"
    assert book.policy_for("p.payments", "E").to_json()["redeliver_to"] == "origin"
    assert "redeliver_to" not in book.default.to_json()  # shown only where it is not the default
