"""Dead letters: the contract's ``dlq.*`` headers, read leniently and written fully.

The protocol is written out in ``docs/dead-letter-protocol.md`` (the public contract is
``docs/contract.md``, "Dead letters and retries").

Whoever fails to process a message hands it to :func:`dead_letter_for`, which keeps
the key, the value bytes and every non-``dlq`` header, and records where the
message came from and why it failed. A message that was itself a redelivery keeps
its ``dlq.id``, original topic and first failure time, and its attempt count goes
up by one, so the scheduler can count attempts across the whole round trip.

:func:`parse_dead_letter` also reads the dead-letter headers of Spring Kafka
(``kafka_dlt-*``), Kafka Connect (``__connect.errors.*``) and Kafka Streams
(``__streams.errors.*``, KIP-1034): origin topic, partition, offset, error class and
message are taken from them when the ``dlq.*`` headers do not say.
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

# Spring Kafka's DeadLetterPublishingRecoverer (KafkaHeaders.DLT_*): topic, class names and
# messages UTF-8; partition a 4-byte big-endian int; offset and timestamp 8-byte big-endian longs.
# With appendOriginalHeaders (the default) a record dead-lettered again carries one more set of
# ``original`` headers: the first is the first failure's record, the last this failure's.
SPRING_ORIGINAL_TOPIC = "kafka_dlt-original-topic"
SPRING_ORIGINAL_PARTITION = "kafka_dlt-original-partition"
SPRING_ORIGINAL_OFFSET = "kafka_dlt-original-offset"
SPRING_ORIGINAL_TIMESTAMP = "kafka_dlt-original-timestamp"
SPRING_EXCEPTION_FQCN = "kafka_dlt-exception-fqcn"
SPRING_EXCEPTION_CAUSE_FQCN = "kafka_dlt-exception-cause-fqcn"
SPRING_EXCEPTION_MESSAGE = "kafka_dlt-exception-message"
SPRING_EXCEPTION_STACKTRACE = "kafka_dlt-exception-stacktrace"
#: Spring's wrapper around a listener's exception: the cause names the real error.
SPRING_WRAPPER = "org.springframework.kafka.listener.ListenerExecutionFailedException"

# Kafka Connect's dead-letter queue (errors.deadletterqueue.context.headers.enable=true): UTF-8 strings.
CONNECT_TOPIC = "__connect.errors.topic"
CONNECT_PARTITION = "__connect.errors.partition"
CONNECT_OFFSET = "__connect.errors.offset"
CONNECT_EXCEPTION = "__connect.errors.exception.class.name"
CONNECT_EXCEPTION_MESSAGE = "__connect.errors.exception.message"

# Kafka Streams' dead-letter queue (KIP-1034, 4.2+): UTF-8 strings. ``exception`` is the class
# name (4.4), or ``Throwable.toString()`` ("class: message") in earlier releases.
STREAMS_TOPIC = "__streams.errors.topic"
STREAMS_PARTITION = "__streams.errors.partition"
STREAMS_OFFSET = "__streams.errors.offset"
STREAMS_EXCEPTION = "__streams.errors.exception"
STREAMS_EXCEPTION_MESSAGE = "__streams.errors.message"

#: How the names of Spring Kafka's, Kafka Connect's and Kafka Streams' dead-letter headers begin.
FOREIGN_PREFIXES = ("kafka_dlt-", "__connect.errors.", "__streams.errors.")

#: The formats a dead letter can be written in, as :attr:`DeadLetter.format` names them.
FORMATS = ("dlq", "spring", "connect", "streams", "none")

HeaderList = list[tuple[str, bytes]]
RawHeaders = Mapping[str, bytes] | Sequence[tuple[str, bytes]] | None


def now_ms() -> int:
    return int(time.time() * 1000)


def header_items(headers: RawHeaders) -> list[tuple[str, bytes]]:
    if headers is None:
        return []
    if isinstance(headers, Mapping):
        return [(k, bytes(v) if v is not None else b"") for k, v in headers.items()]
    # Headers as Kafka clients hand them over are (str, bytes) tuples already: a copy of the
    # list then, without a new tuple per header (this runs for every dead letter read).
    for item in headers:
        if item.__class__ is not tuple or item[1].__class__ is not bytes:
            return [(k, bytes(v) if v is not None else b"") for k, v in headers]
    return list(headers)


def _text(v: bytes) -> str:
    return v.decode("utf-8", errors="replace")


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def content_id(origin_topic: str, key: bytes | None, value: bytes | None) -> str:
    """The id of a dead letter that arrived without ``dlq.id``: its origin topic, key and value,
    so each re-failure of the same message, wherever it lands on ``dead-letters``, has the same id
    (and its attempts add up) rather than a new one at attempt 1."""
    h = hashlib.sha256(b"content\x00")
    h.update(origin_topic.encode())
    h.update(b"\x00")
    h.update(b"-" if key is None else b"k" + hashlib.sha256(key).digest())
    h.update(b"-" if value is None else b"v" + hashlib.sha256(value).digest())
    return h.hexdigest()[:32]


#: Header names :func:`letter_fingerprint` keeps encoded (bounded: names are anyone's to choose).
_FINGERPRINT_NAMES: dict[str, tuple[bytes, bytes]] = {}
_FINGERPRINT_NAMES_KEPT = 1024


def letter_fingerprint(
    key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]], timestamp_ms: int | None
) -> str:
    """What makes one dead-letter record itself: key, value, every header in order and the
    record's timestamp. The same record read twice, or sent twice by a producer's retry, has
    the same fingerprint; a re-failure of the same message is a new record with a later
    timestamp (and, from Spring or Connect, new failure headers), so it has another."""
    h = hashlib.blake2b(digest_size=8)
    for part in (key, value):
        h.update(b"-" if part is None else b"+%d:" % len(part))
        h.update(part or b"")
    names = _FINGERPRINT_NAMES
    for name, raw in headers:
        # A name's bytes and its length's prefix, kept: a few names make up most headers.
        known = names.get(name)
        if known is None:
            encoded = name.encode()
            known = (b"%d:" % len(encoded), encoded)
            if len(names) < _FINGERPRINT_NAMES_KEPT:
                names[name] = known
        h.update(b"%b%d:%b%b" % (known[0], len(raw), known[1], raw))
    h.update(b"t%d" % (timestamp_ms if timestamp_ms is not None else -1))
    return h.hexdigest()


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
    #: Which headers described it: ``dlq`` (any ``dlq.*`` header), ``spring``, ``connect``,
    #: ``streams`` (another framework's dead-letter headers only), or ``none``.
    format: str = "dlq"
    #: :func:`letter_fingerprint` of the record it was read from ("" when written here).
    fingerprint: str = ""
    #: Whether ``dlq.retry.topic`` was given (else the policy may choose the origin topic).
    retry_topic_given: bool = True
    #: Whether it came in the full form (:func:`full_form`): each of its ``dlq.*`` headers, kept
    #: as it came, spells the field read from it. Not part of what the letter is.
    full_form: bool = field(default=False, compare=False)

    def headers(self) -> HeaderList:
        """Every header to send: the message's own headers, then the ``dlq.*`` ones."""
        return [*self.other_headers, *self.dlq_headers()]

    def dlq_headers(self) -> HeaderList:
        """The ``dlq.*`` headers alone, every one of them, in the protocol's order."""
        return [
            (ID, self.id.encode()),
            (ORIGINAL_TOPIC, self.original_topic.encode()),
            (ORIGINAL_PARTITION, str(self.original_partition).encode()),
            (ORIGINAL_OFFSET, str(self.original_offset).encode()),
            (RETRY_TOPIC, self.retry_topic.encode()),
            (ATTEMPT, str(self.attempt).encode()),
            (ERROR_CLASS, self.error_class.encode()),
            (ERROR_MESSAGE, self.error_message.encode()),
            (FIRST_FAILED_AT, str(self.first_failed_at).encode()),
            (FAILED_AT, str(self.failed_at).encode()),
        ]


@dataclass(frozen=True, slots=True)
class ForeignFailure:
    """What another framework's dead-letter headers say: the format, where the message was
    first read (the origin), and the failure they describe with its place among the headers
    (the later of two descriptions is the newer one)."""

    format: str
    origin_topic: str | None = None
    origin_partition: int | None = None
    origin_offset: int | None = None
    error_class: str | None = None
    error_message: str | None = None
    error_at: int = -1


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _text_int(raw: bytes) -> int | None:
    try:
        return int(_text(raw).strip())
    except ValueError:
        return None


def _binary_int(raw: bytes) -> int | None:
    """Spring's numbers: a 4- or 8-byte big-endian int; digits are accepted too."""
    if len(raw) in (4, 8):
        return int.from_bytes(raw, "big", signed=True)
    return _text_int(raw)


def _streams_class(text: str) -> str:
    """Kafka Streams before 4.4 wrote ``Throwable.toString()``: the class is before ``": "``."""
    head, sep, _ = text.partition(": ")
    return head if sep and " " not in head else text


def foreign_failure(items: Sequence[tuple[str, bytes]]) -> ForeignFailure | None:
    """Spring Kafka's, Kafka Connect's or Kafka Streams' dead-letter headers, or ``None``.

    The origin is read from the first of its headers (an earlier hop's, when a record was
    dead-lettered again with the headers it had), the error from the last."""
    first: dict[str, bytes] = {}
    last: dict[str, tuple[int, bytes]] = {}
    for i, (name, raw) in enumerate(items):
        if name.startswith(FOREIGN_PREFIXES):
            first.setdefault(name, raw)
            last[name] = (i, raw)
    if not first:
        return None
    if any(name.startswith("kafka_dlt-") for name in first):
        fqcn_at, fqcn = last.get(SPRING_EXCEPTION_FQCN, (-1, b""))
        cause = last.get(SPRING_EXCEPTION_CAUSE_FQCN)
        error_class = _text(fqcn) if fqcn_at >= 0 else None
        if cause is not None and (error_class is None or error_class == SPRING_WRAPPER):
            error_class = _text(cause[1])
        message = last.get(SPRING_EXCEPTION_MESSAGE)
        topic = first.get(SPRING_ORIGINAL_TOPIC)
        partition = first.get(SPRING_ORIGINAL_PARTITION)
        offset = first.get(SPRING_ORIGINAL_OFFSET)
        return ForeignFailure(
            "spring",
            _text(topic) if topic else None,
            _binary_int(partition) if partition is not None else None,
            _binary_int(offset) if offset is not None else None,
            error_class,
            _text(message[1]) if message is not None else None,
            max(fqcn_at, cause[0] if cause is not None else -1),
        )
    if any(name.startswith("__connect.errors.") for name in first):
        fmt, names = "connect", (CONNECT_TOPIC, CONNECT_PARTITION, CONNECT_OFFSET, CONNECT_EXCEPTION, CONNECT_EXCEPTION_MESSAGE)
    else:
        fmt, names = "streams", (STREAMS_TOPIC, STREAMS_PARTITION, STREAMS_OFFSET, STREAMS_EXCEPTION, STREAMS_EXCEPTION_MESSAGE)
    topic_h, partition_h, offset_h, class_h, message_h = names
    place, cls = last.get(class_h, (-1, b""))
    f_message = last.get(message_h)
    f_topic, f_partition, f_offset = first.get(topic_h), first.get(partition_h), first.get(offset_h)
    error_class = _text(cls) or None
    if fmt == "streams" and error_class is not None:
        error_class = _streams_class(error_class)
    return ForeignFailure(
        fmt,
        _text(f_topic) if f_topic else None,
        _text_int(f_partition) if f_partition is not None else None,
        _text_int(f_offset) if f_offset is not None else None,
        error_class,
        _text(f_message[1]) if f_message is not None else None,
        place,
    )


#: The ``dlq.*`` headers in the order :meth:`DeadLetter.dlq_headers` writes them.
DLQ_HEADERS = (
    ID,
    ORIGINAL_TOPIC,
    ORIGINAL_PARTITION,
    ORIGINAL_OFFSET,
    RETRY_TOPIC,
    ATTEMPT,
    ERROR_CLASS,
    ERROR_MESSAGE,
    FIRST_FAILED_AT,
    FAILED_AT,
)


def full_form(key: bytes | None, value: bytes | None, items: HeaderList, timestamp_ms: int | None) -> DeadLetter | None:
    """The dead letter of ``items`` when they are in the full form, else ``None``.

    The full form is what :func:`dead_letter_for` writes: each of the ten ``dlq.*`` headers
    once and no other ``dlq.*`` header, the texts non-empty (the message may be empty) and in
    UTF-8, the numbers in plain decimal (no sign but a minus, no spaces or leading zeros) and
    an attempt of 1 or more, and no other framework's dead-letter headers. For such headers
    :func:`parse_dead_letter` reads the same letter without its defaults and fallbacks, and
    each header spells the field read from it, so a reader may keep them as they came."""
    named = dict(items)
    other = [item for item in items if not item[0].startswith(DLQ_PREFIX)]
    if len(named) != len(items) or len(other) + len(DLQ_HEADERS) != len(items):
        return None  # a header twice, or a dlq.* header missing or not the protocol's
    for name, _ in other:
        if name.startswith(FOREIGN_PREFIXES):
            return None
    try:
        dlq_id, origin_topic, retry_topic = named[ID].decode(), named[ORIGINAL_TOPIC].decode(), named[RETRY_TOPIC].decode()
        error_class, error_message = named[ERROR_CLASS].decode(), named[ERROR_MESSAGE].decode()
        numbers = (named[ORIGINAL_PARTITION], named[ORIGINAL_OFFSET], named[ATTEMPT], named[FIRST_FAILED_AT], named[FAILED_AT])
        partition, offset, attempt, first_failed_at, failed_at = [int(n) for n in numbers]
    except (KeyError, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    if (
        not (dlq_id and origin_topic and retry_topic and error_class)
        or attempt < 1
        or len(error_message) > MAX_ERROR_MESSAGE
        or (b"%d" % partition, b"%d" % offset, b"%d" % attempt, b"%d" % first_failed_at, b"%d" % failed_at) != numbers
    ):
        return None
    return DeadLetter(
        dlq_id,
        key,
        value,
        origin_topic,
        partition,
        offset,
        retry_topic,
        attempt,
        error_class,
        error_message,
        first_failed_at,
        failed_at,
        other,
        "dlq",
        letter_fingerprint(key, value, items, timestamp_ms),
        True,
        True,
    )


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
    """Read a dead letter off ``dead-letters``; missing headers get the contract's defaults.

    ``dlq.*`` headers come first; where they are missing, Spring Kafka's, Kafka Connect's or
    Kafka Streams' dead-letter headers give the origin and the error. When both describe an
    error, the one written later (further down the header list) is this failure's: Spring
    appends its exception headers to those it copied, and :func:`dead_letter_for` appends
    its ``dlq.*`` ones. A letter without ``dlq.id`` gets :func:`content_id`.

    A letter in the full form (:func:`full_form`), the form most producers write, is read
    there: the same letter :func:`parse_any_form` reads, without the defaults it cannot need.
    """
    items = header_items(headers)
    return parse_items(
        key,
        value,
        items,
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp_ms=timestamp_ms,
        default_retry_topic=default_retry_topic,
    )


def parse_items(
    key: bytes | None,
    value: bytes | None,
    items: HeaderList,
    *,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int | None,
    default_retry_topic: str,
) -> DeadLetter:
    """:func:`parse_dead_letter` of headers already as :func:`header_items` gives them."""
    letter = full_form(key, value, items, timestamp_ms)
    if letter is not None:
        return letter
    return parse_any_form(
        key,
        value,
        items,
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp_ms=timestamp_ms,
        default_retry_topic=default_retry_topic,
    )


def parse_any_form(
    key: bytes | None,
    value: bytes | None,
    items: HeaderList,
    *,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int | None,
    default_retry_topic: str,
) -> DeadLetter:
    """:func:`parse_dead_letter` for headers in any form (as :func:`header_items` gives them):
    the contract's defaults, the other frameworks' headers, repeated and malformed headers."""
    dlq: dict[str, str] = {}
    other: HeaderList = []
    error_at = -1
    has_foreign = False
    for i, item in enumerate(items):
        k = item[0]
        if k.startswith(DLQ_PREFIX):
            dlq[k] = item[1].decode("utf-8", errors="replace")
            if k == ERROR_CLASS:
                error_at = i
        else:
            other.append(item)
            # Another framework's headers are among the others; most letters have none to look for.
            has_foreign = has_foreign or k.startswith(FOREIGN_PREFIXES)
    foreign = foreign_failure(items) if has_foreign else None
    failed_at = _int(dlq.get(FAILED_AT), timestamp_ms if timestamp_ms is not None else now_ms())
    fallback = foreign if foreign is not None and foreign.origin_topic else None
    origin = (
        dlq.get(ORIGINAL_TOPIC) or (fallback.origin_topic if fallback is not None else None) or topic,
        _int(dlq.get(ORIGINAL_PARTITION), _or(fallback.origin_partition if fallback is not None else None, partition)),
        _int(dlq.get(ORIGINAL_OFFSET), _or(fallback.origin_offset if fallback is not None else None, offset)),
    )
    error_class = dlq.get(ERROR_CLASS) or None
    error_message = dlq.get(ERROR_MESSAGE) or ""
    if foreign is not None and foreign.error_class and (error_class is None or foreign.error_at > error_at):
        error_class, error_message = foreign.error_class, foreign.error_message or ""
    fmt = "dlq" if dlq else foreign.format if foreign is not None else "none"
    return DeadLetter(
        id=dlq.get(ID) or content_id(origin[0], key, value),
        key=key,
        value=value,
        original_topic=origin[0],
        original_partition=origin[1],
        original_offset=origin[2],
        retry_topic=dlq.get(RETRY_TOPIC) or default_retry_topic,
        attempt=max(1, _int(dlq.get(ATTEMPT), 1)),
        error_class=error_class or "Unknown",
        error_message=error_message[:MAX_ERROR_MESSAGE],
        first_failed_at=_int(dlq.get(FIRST_FAILED_AT), failed_at),
        failed_at=failed_at,
        other_headers=other,
        format=fmt,
        fingerprint=letter_fingerprint(key, value, items, timestamp_ms),
        retry_topic_given=bool(dlq.get(RETRY_TOPIC)),
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
