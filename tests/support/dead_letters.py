"""Dead-letter headers for the retry scheduler's tests, on the driver and on the broker."""

from __future__ import annotations

import time

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
