from __future__ import annotations

from shared import dead_letters as dl


def test_missing_headers_get_contract_defaults() -> None:
    letter = dl.parse_dead_letter(
        b"k", b"v", None, topic="dead-letters", partition=3, offset=17, timestamp_ms=1000, default_retry_topic="retry"
    )
    assert letter.attempt == 1
    assert letter.retry_topic == "retry"
    assert letter.original_topic == "dead-letters"
    assert letter.first_failed_at == letter.failed_at == 1000
    again = dl.parse_dead_letter(
        b"k", b"v", [], topic="dead-letters", partition=3, offset=17, timestamp_ms=2000, default_retry_topic="retry"
    )
    assert again.id == letter.id and len(letter.id) == 32


def test_first_failure_then_redelivery_counts_attempts_and_keeps_identity() -> None:
    first = dl.dead_letter_for(
        b"k",
        b"payload",
        [("trace", b"t1")],
        topic="logins",
        partition=1,
        offset=5,
        error=ValueError("boom"),
        retry_topic="retry-tallies",
        failed_at=100,
    )
    assert first.attempt == 1 and first.error_class == "ValueError" and first.error_message == "boom"
    headers = dict(first.headers())
    assert headers["trace"] == b"t1"
    assert headers[dl.ORIGINAL_TOPIC] == b"logins"
    assert headers[dl.RETRY_TOPIC] == b"retry-tallies"
    second = dl.dead_letter_for(
        b"k",
        b"payload",
        first.headers(),
        topic="retry-tallies",
        partition=0,
        offset=9,
        error=KeyError("x"),
        retry_topic="ignored",
        failed_at=200,
    )
    assert second.id == first.id
    assert second.attempt == 2
    assert second.original_topic == "logins" and second.original_offset == 5
    assert second.retry_topic == "retry-tallies"
    assert second.first_failed_at == 100 and second.failed_at == 200
    assert second.error_class == "KeyError"
    assert [k for k, _ in second.headers()].count(dl.ATTEMPT) == 1


def test_long_error_messages_are_truncated() -> None:
    letter = dl.dead_letter_for(
        None, None, None, topic="t", partition=0, offset=0, error=RuntimeError("x" * 5000), retry_topic="r"
    )
    assert len(letter.error_message) == dl.MAX_ERROR_MESSAGE
