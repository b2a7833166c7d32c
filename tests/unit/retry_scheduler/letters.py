"""Dead-letter headers for the retry scheduler's tests on the topology driver."""

from __future__ import annotations

from shared import dead_letters as dl


def letter_headers(
    dlq_id: str, *, attempt: int, failed_at: int, origin: str = "orders", retry_topic: str = "retry-orders"
) -> list[tuple[str, bytes]]:
    """Every header a dead letter of ``origin`` carries, as a failing consumer writes them."""
    return [
        (name, str(value).encode())
        for name, value in {
            dl.ID: dlq_id,
            dl.ORIGINAL_TOPIC: origin,
            dl.ORIGINAL_PARTITION: 0,
            dl.ORIGINAL_OFFSET: 7,
            dl.RETRY_TOPIC: retry_topic,
            dl.ATTEMPT: attempt,
            dl.ERROR_CLASS: "Boom",
            dl.ERROR_MESSAGE: "it broke",
            dl.FIRST_FAILED_AT: failed_at,
            dl.FAILED_AT: failed_at,
        }.items()
    ]
