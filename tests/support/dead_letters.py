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
