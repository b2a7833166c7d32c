"""Dead-letter headers for the retry scheduler's tests, on the driver and on the broker."""

from __future__ import annotations

import time

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from shared import dead_letters as dl


def letter_headers(
    dlq_id: str,
    retry_topic: str,
    *,
    attempt: int = 1,
    origin: str = "orders",
    error: str = "Boom",
    failed_at: int | None = None,
    extra: list[tuple[str, bytes]] | None = None,
) -> list[tuple[str, bytes]]:
    """Every header a dead letter of ``origin`` carries, as a failing consumer writes them
    (``extra`` first; ``failed_at`` defaults to now)."""
    at = failed_at if failed_at is not None else int(time.time() * 1000)
    return [
        *(extra or []),
        *[
            (k, str(v).encode())
            for k, v in {
                dl.ID: dlq_id,
                dl.ORIGINAL_TOPIC: origin,
                dl.ORIGINAL_PARTITION: 0,
                dl.ORIGINAL_OFFSET: 7,
                dl.RETRY_TOPIC: retry_topic,
                dl.ATTEMPT: attempt,
                dl.ERROR_CLASS: error,
                dl.ERROR_MESSAGE: "it broke",
                dl.FIRST_FAILED_AT: at,
                dl.FAILED_AT: at,
            }.items()
        ],
    ]


def spring_headers(
    topic: str, partition: int, offset: int, fqcn: str, message: str, cause: str | None = None
) -> list[tuple[str, bytes]]:
    """Headers as Spring Kafka's DeadLetterPublishingRecoverer appends them (KafkaHeaders.DLT_*,
    with Spring's binary partition, offset and timestamp)."""
    headers = [
        (dl.SPRING_ORIGINAL_TOPIC, topic.encode()),
        (dl.SPRING_ORIGINAL_PARTITION, partition.to_bytes(4, "big", signed=True)),
        (dl.SPRING_ORIGINAL_OFFSET, offset.to_bytes(8, "big", signed=True)),
        (dl.SPRING_ORIGINAL_TIMESTAMP, (1_700_000_000_000).to_bytes(8, "big")),
        ("kafka_dlt-original-timestamp-type", b"CreateTime"),
        (dl.SPRING_EXCEPTION_FQCN, fqcn.encode()),
    ]
    if cause is not None:
        headers.append((dl.SPRING_EXCEPTION_CAUSE_FQCN, cause.encode()))
    return [*headers, (dl.SPRING_EXCEPTION_MESSAGE, message.encode()), (dl.SPRING_EXCEPTION_STACKTRACE, b"at X.y(X.java:1)")]


def connect_headers(topic: str, partition: int, offset: int, exception: str, message: str) -> list[tuple[str, bytes]]:
    """Headers as Kafka Connect's dead-letter queue writes them (context headers enabled)."""
    return [
        (dl.CONNECT_TOPIC, topic.encode()),
        (dl.CONNECT_PARTITION, str(partition).encode()),
        (dl.CONNECT_OFFSET, str(offset).encode()),
        ("__connect.errors.connector.name", b"sink"),
        ("__connect.errors.task.id", b"0"),
        ("__connect.errors.stage", b"VALUE_CONVERTER"),
        ("__connect.errors.class.name", b"org.apache.kafka.connect.json.JsonConverter"),
        (dl.CONNECT_EXCEPTION, exception.encode()),
        (dl.CONNECT_EXCEPTION_MESSAGE, message.encode()),
        ("__connect.errors.exception.stacktrace", b"..."),
    ]


def streams_headers(topic: str, partition: int, offset: int, exception: str, message: str) -> list[tuple[str, bytes]]:
    """Headers as Kafka Streams' dead-letter queue (KIP-1034, 4.4) writes them."""
    return [
        (dl.STREAMS_EXCEPTION, exception.encode()),
        (dl.STREAMS_EXCEPTION_MESSAGE, message.encode()),
        ("__streams.errors.stacktrace", b"..."),
        (dl.STREAMS_TOPIC, topic.encode()),
        (dl.STREAMS_PARTITION, str(partition).encode()),
        (dl.STREAMS_OFFSET, str(offset).encode()),
    ]


def full_form_headers() -> SearchStrategy[tuple[list[tuple[str, bytes]], bool]]:
    """Headers in the full form (``shared.dead_letters.full_form``) in any order, with a few
    others, and ``True``; or such headers changed in one way that leaves the form (a number
    spelled otherwise, a header missing, repeated or empty, another framework's header, bytes
    that are not UTF-8), and ``False``."""
    texts = st.text(min_size=1, max_size=10).map(str.encode)
    numbers = st.one_of(st.integers(-(2**64), 2**64), st.integers(0, 2**60), st.integers(1, 9)).map(lambda n: b"%d" % n)
    full = st.fixed_dictionaries(
        {
            dl.ID: texts,
            dl.ORIGINAL_TOPIC: texts,
            dl.ORIGINAL_PARTITION: numbers,
            dl.ORIGINAL_OFFSET: numbers,
            dl.RETRY_TOPIC: st.one_of(texts, st.sampled_from([b"retry", b"dead-letters"])),
            dl.ATTEMPT: st.integers(1, 2**40).map(lambda n: b"%d" % n),
            dl.ERROR_CLASS: texts,
            dl.ERROR_MESSAGE: st.one_of(st.just(b""), texts, st.just(b"m" * dl.MAX_ERROR_MESSAGE)),
            dl.FIRST_FAILED_AT: numbers,
            dl.FAILED_AT: numbers,
        }
    )
    others = st.lists(st.tuples(st.sampled_from(["traceparent", "x", "content-type"]), st.binary(max_size=8)), max_size=3)
    leaving = st.sampled_from(
        [
            (dl.ATTEMPT, b"07"),
            (dl.ATTEMPT, b"0"),
            (dl.ORIGINAL_OFFSET, b" 5"),
            (dl.FAILED_AT, b"+5"),
            (dl.FIRST_FAILED_AT, b"1_000"),
            (dl.ID, b""),
            (dl.ERROR_CLASS, b""),
            (dl.ORIGINAL_TOPIC, b"\xff"),
            (dl.ERROR_MESSAGE, b"m" * (dl.MAX_ERROR_MESSAGE + 1)),
            ("dlq.other", b"1"),
            (dl.SPRING_EXCEPTION_FQCN, b"java.io.IOException"),
            (dl.CONNECT_TOPIC, b"orders"),
            ("missing", dl.RETRY_TOPIC.encode()),
            ("repeated", dl.ATTEMPT.encode()),
        ]
    )

    @st.composite
    def build(draw: st.DrawFn) -> tuple[list[tuple[str, bytes]], bool]:
        headers = list(draw(full).items()) + draw(others)
        headers = draw(st.permutations(headers))
        if draw(st.booleans()):
            return headers, len({name for name, _ in headers}) == len(headers)
        name, value = draw(leaving)
        if name == "missing":
            headers = [h for h in headers if h[0] != value.decode()]
        elif name == "repeated":
            headers.append((value.decode(), b"1"))
        elif name.startswith(dl.DLQ_PREFIX) and name != "dlq.other":
            headers = [(n, value if n == name else v) for n, v in headers]
        else:
            headers.insert(draw(st.integers(0, len(headers))), (name, value))
        return headers, False

    return build()
