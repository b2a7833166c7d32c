"""Dead letters: the contract's ``dlq.*`` headers, read leniently and written fully.

Whoever fails to process a message hands it to :func:`dead_letter_for`, which keeps
the key, the value bytes and every non-``dlq`` header, and records where the
message came from and why it failed. A message that was itself a redelivery keeps
its ``dlq.id``, original topic and first failure time, and its attempt count goes
up by one, so the scheduler can count attempts across the whole round trip.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

ID = "dlq.id"
ORIGINAL_TOPIC = "dlq.original.topic"
ORIGINAL_PARTITION = "dlq.original.partition"
ORIGINAL_OFFSET = "dlq.original.offset"
RETRY_TOPIC = "dlq.retry.topic"
ATTEMPT = "dlq.attempt"
ERROR_CLASS = "dlq.error.class"
ERROR_MESSAGE = "dlq.error.message"
FIRST_FAILED_AT = "dlq.first.failed.at"
FAILED_AT = "dlq.failed.at"

DLQ_PREFIX = "dlq."
MAX_ERROR_MESSAGE = 2000

HeaderList = list[tuple[str, bytes]]
RawHeaders = Mapping[str, bytes] | Sequence[tuple[str, bytes]] | None


def now_ms() -> int:
    return int(time.time() * 1000)


def header_items(headers: RawHeaders) -> list[tuple[str, bytes]]:
    if headers is None:
        return []
    if isinstance(headers, Mapping):
        return [(k, bytes(v) if v is not None else b"") for k, v in headers.items()]
    return [(k, bytes(v) if v is not None else b"") for k, v in headers]


def _text(v: bytes) -> str:
    return v.decode("utf-8", errors="replace")


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def derive_id(topic: str | None, partition: int | None, offset: int | None, key: bytes | None, value: bytes | None) -> str:
    """A stable id for a dead letter that arrived without one: the same message gives the same id."""
    h = hashlib.sha256()
    for part in (topic or "", str(partition), str(offset)):
        h.update(part.encode())
        h.update(b"\x00")
    h.update(key or b"")
    h.update(b"\x00")
    h.update(value or b"")
    return h.hexdigest()[:32]


@dataclass
class DeadLetter:
    """A dead letter as the scheduler sees it: the message plus its parsed ``dlq.*`` headers."""

    id: str
    key: bytes | None
    value: bytes | None
    original_topic: str
    original_partition: int
    original_offset: int
    retry_topic: str
    attempt: int
    error_class: str
    error_message: str
    first_failed_at: int
    failed_at: int
    other_headers: HeaderList = field(default_factory=list)

    def headers(self) -> HeaderList:
        """Every header to send: the message's own headers, then the ``dlq.*`` ones."""
        dlq = {
            ID: self.id,
            ORIGINAL_TOPIC: self.original_topic,
            ORIGINAL_PARTITION: str(self.original_partition),
            ORIGINAL_OFFSET: str(self.original_offset),
            RETRY_TOPIC: self.retry_topic,
            ATTEMPT: str(self.attempt),
            ERROR_CLASS: self.error_class,
            ERROR_MESSAGE: self.error_message,
            FIRST_FAILED_AT: str(self.first_failed_at),
            FAILED_AT: str(self.failed_at),
        }
        return list(self.other_headers) + [(k, v.encode()) for k, v in dlq.items()]


def parse_dead_letter(
    key: bytes | None,
    value: bytes | None,
    headers: RawHeaders,
    *,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int | None,
    default_retry_topic: str,
) -> DeadLetter:
    """Read a dead letter off ``dead-letters``; missing headers get the contract's defaults."""
    items = header_items(headers)
    dlq = {k: _text(v) for k, v in items if k.startswith(DLQ_PREFIX)}
    other = [(k, v) for k, v in items if not k.startswith(DLQ_PREFIX)]
    failed_at = _int(dlq.get(FAILED_AT), timestamp_ms if timestamp_ms is not None else now_ms())
    return DeadLetter(
        id=dlq.get(ID) or derive_id(topic, partition, offset, key, value),
        key=key,
        value=value,
        original_topic=dlq.get(ORIGINAL_TOPIC) or topic,
        original_partition=_int(dlq.get(ORIGINAL_PARTITION), partition),
        original_offset=_int(dlq.get(ORIGINAL_OFFSET), offset),
        retry_topic=dlq.get(RETRY_TOPIC) or default_retry_topic,
        attempt=max(1, _int(dlq.get(ATTEMPT), 1)),
        error_class=dlq.get(ERROR_CLASS) or "Unknown",
        error_message=dlq.get(ERROR_MESSAGE) or "",
        first_failed_at=_int(dlq.get(FIRST_FAILED_AT), failed_at),
        failed_at=failed_at,
        other_headers=other,
    )


def dead_letter_for(
    key: bytes | None,
    value: bytes | None,
    headers: RawHeaders,
    *,
    topic: str,
    partition: int,
    offset: int,
    error: BaseException,
    retry_topic: str,
    failed_at: int | None = None,
) -> DeadLetter:
    """The dead letter for a message that failed to process.

    A first failure starts at attempt 1. A message that carries ``dlq.*`` headers was
    redelivered by the scheduler: it keeps its id and origin and counts one more attempt.
    """
    at = failed_at if failed_at is not None else now_ms()
    items = header_items(headers)
    dlq = {k: _text(v) for k, v in items if k.startswith(DLQ_PREFIX)}
    other = [(k, v) for k, v in items if not k.startswith(DLQ_PREFIX)]
    message = str(error) or type(error).__name__
    redelivered = ID in dlq
    return DeadLetter(
        id=dlq[ID] if redelivered else derive_id(topic, partition, offset, key, value),
        key=key,
        value=value,
        original_topic=dlq.get(ORIGINAL_TOPIC, topic) if redelivered else topic,
        original_partition=_int(dlq.get(ORIGINAL_PARTITION), partition) if redelivered else partition,
        original_offset=_int(dlq.get(ORIGINAL_OFFSET), offset) if redelivered else offset,
        retry_topic=dlq.get(RETRY_TOPIC, retry_topic) if redelivered else retry_topic,
        attempt=_int(dlq.get(ATTEMPT), 0) + 1 if redelivered else 1,
        error_class=type(error).__name__,
        error_message=message[:MAX_ERROR_MESSAGE],
        first_failed_at=_int(dlq.get(FIRST_FAILED_AT), at) if redelivered else at,
        failed_at=at,
        other_headers=other,
    )


def headers_dict(headers: Iterable[tuple[str, bytes]]) -> dict[str, str]:
    return {k: _text(v) for k, v in headers}
