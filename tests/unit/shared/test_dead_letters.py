from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shared import dead_letters as dl
from tests.support.dead_letters import connect_headers, full_form_headers, spring_headers, streams_headers


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


def parse(
    headers: list[tuple[str, bytes]], *, key: bytes = b"k", value: bytes = b"v", offset: int = 17, ts: int = 1000
) -> dl.DeadLetter:
    return dl.parse_dead_letter(
        key, value, headers, topic="dead-letters", partition=3, offset=offset, timestamp_ms=ts, default_retry_topic="retry"
    )


def test_a_spring_dead_letter_gives_its_origin_and_error() -> None:
    letter = parse(spring_headers("payments", 2, 4_000_000_000, "java.net.SocketTimeoutException", "read timed out"))
    assert (letter.original_topic, letter.original_partition, letter.original_offset) == ("payments", 2, 4_000_000_000)
    assert (letter.error_class, letter.error_message) == ("java.net.SocketTimeoutException", "read timed out")
    assert letter.format == "spring" and letter.attempt == 1 and not letter.retry_topic_given
    assert letter.id == dl.content_id("payments", b"k", b"v")


def test_springs_listener_wrapper_is_named_by_its_cause() -> None:
    letter = parse(spring_headers("payments", 0, 1, dl.SPRING_WRAPPER, "Listener failed", cause="com.acme.PaymentDeclined"))
    assert letter.error_class == "com.acme.PaymentDeclined" and letter.error_message == "Listener failed"


def test_the_failure_described_last_is_this_one() -> None:
    """Spring re-failing a redelivery copies the dlq.* headers it got and appends its own: its
    error is this failure's, the origin stays the first one; a Python consumer re-failing a
    Spring letter appends dlq.* headers after the old kafka_dlt-* ones: those win."""
    redelivered = [(k, v) for k, v in first_dlq_headers()]
    spring_again = parse([*redelivered, *spring_headers("retry", 0, 9, "java.lang.IllegalStateException", "still broken")])
    assert spring_again.id == "id-1" and spring_again.original_topic == "orders" and spring_again.original_offset == 5
    assert spring_again.error_class == "java.lang.IllegalStateException" and spring_again.error_message == "still broken"
    python_again = parse([*spring_headers("orders", 0, 5, "java.lang.IllegalStateException", "old"), *redelivered])
    assert python_again.error_class == "ValueError" and python_again.error_message == "boom"


def first_dlq_headers() -> list[tuple[str, bytes]]:
    return [
        (dl.ID, b"id-1"),
        (dl.ORIGINAL_TOPIC, b"orders"),
        (dl.ORIGINAL_PARTITION, b"0"),
        (dl.ORIGINAL_OFFSET, b"5"),
        (dl.ATTEMPT, b"1"),
        (dl.ERROR_CLASS, b"ValueError"),
        (dl.ERROR_MESSAGE, b"boom"),
    ]


def test_a_kafka_connect_dead_letter_gives_its_origin_and_error() -> None:
    letter = parse(
        [
            ("trace", b"t"),
            *connect_headers(
                "orders", 1, 42, "org.apache.kafka.connect.errors.DataException", "Converting byte[] to Kafka Connect data failed"
            ),
        ]
    )
    assert (letter.original_topic, letter.original_partition, letter.original_offset) == ("orders", 1, 42)
    assert letter.error_class == "org.apache.kafka.connect.errors.DataException"
    assert letter.error_message.startswith("Converting byte[]") and letter.format == "connect"


def test_a_kafka_streams_dead_letter_gives_its_origin_and_error_in_both_spellings() -> None:
    def streams(exception: bytes) -> dl.DeadLetter:
        letter = parse(streams_headers("clicks", 4, 99, "x", "bad record"))
        return parse(
            [(k, exception if k == dl.STREAMS_EXCEPTION else v) for k, v in letter.headers() if not k.startswith("dlq.")]
        )

    for exception in (
        b"org.apache.kafka.common.errors.SerializationException",
        b"org.apache.kafka.common.errors.SerializationException: bad record",
    ):
        letter = streams(exception)
        assert (letter.original_topic, letter.original_partition, letter.original_offset) == ("clicks", 4, 99)
        assert (letter.error_class, letter.error_message) == (
            "org.apache.kafka.common.errors.SerializationException",
            "bad record",
        )
        assert letter.format == "streams"


def test_a_letter_without_headers_is_identified_by_its_content_not_its_position() -> None:
    first = parse([], offset=17, ts=1000)
    again = parse([], offset=900, ts=5000)
    assert first.id == again.id and first.format == "none"
    assert parse([], value=b"other").id != first.id
    assert first.fingerprint != again.fingerprint  # another record: a re-failure, not a copy


def test_the_same_record_has_the_same_fingerprint() -> None:
    headers = [("a", b"1"), ("b", b"2")]
    assert parse(headers).fingerprint == parse(list(headers), offset=99).fingerprint
    assert parse(headers).fingerprint != parse(headers[::-1]).fingerprint
    assert parse(headers).fingerprint != parse(headers, ts=1001).fingerprint


def test_fingerprints_stay_those_already_stored() -> None:
    # Entries keep the fingerprints of the records taken in: a record read again after an
    # upgrade must hash as it did before, or it would be taken for a re-failure.
    assert dl.letter_fingerprint(b"k", b"v", [("dlq.id", b"d1"), ("x", b"")], 1700000000000) == "29b13587c31942f9"
    assert dl.letter_fingerprint(None, None, [], None) == "c11fe431a0243f2e"
    assert dl.letter_fingerprint(b"", b"\xff", [("\u00e9", b"\x00")], -5) == "bc464abc93c3abc7"
    # None and empty differ, as do where one field ends and the next begins
    assert dl.letter_fingerprint(None, b"", [], 1) != dl.letter_fingerprint(b"", b"", [], 1)
    assert dl.letter_fingerprint(b"ab", b"c", [], 1) != dl.letter_fingerprint(b"a", b"bc", [], 1)
    assert dl.letter_fingerprint(None, None, [("ab", b"c")], 1) != dl.letter_fingerprint(None, None, [("a", b"bc")], 1)


@settings(max_examples=300, deadline=None)
@given(
    case=full_form_headers(),
    key=st.one_of(st.none(), st.binary(max_size=6)),
    timestamp=st.one_of(st.none(), st.integers(0, 2**42)),
)
def test_a_letter_in_the_full_form_reads_as_in_any_form(
    case: tuple[list[tuple[str, bytes]], bool], key: bytes | None, timestamp: int | None
) -> None:
    headers, in_full_form = case
    where = {"topic": "dead-letters", "partition": 2, "offset": 9, "timestamp_ms": timestamp, "default_retry_topic": "retry"}
    letter = dl.parse_dead_letter(key, b"v", headers, **where)  # type: ignore[arg-type]
    assert letter.full_form == in_full_form
    assert letter == dl.parse_any_form(key, b"v", dl.header_items(headers), **where)  # type: ignore[arg-type]


def test_what_dead_letter_for_writes_is_in_the_full_form() -> None:
    first = dl.dead_letter_for(
        b"k", b"v", [("trace", b"t")], topic="orders", partition=1, offset=5, error=KeyError("x"), retry_topic="retry"
    )
    again = dl.dead_letter_for(
        b"k", b"v", first.headers(), topic="retry", partition=0, offset=1, error=ValueError(), retry_topic="retry"
    )
    for letter in (first, again):
        read = dl.parse_dead_letter(
            b"k", b"v", letter.headers(), topic="dead-letters", partition=0, offset=0, timestamp_ms=1, default_retry_topic="x"
        )
        assert read.full_form and (read.id, read.attempt, read.error_class) == (letter.id, letter.attempt, letter.error_class)
