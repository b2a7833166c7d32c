"""Dead letters shaped like production's, for the console's layout tests: dlq ids of a few
hundred characters with no place to break, fully qualified exception classes, long topic
names, and error messages that are whole stack traces with long URLs in them."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable

from aiokafka import AIOKafkaProducer

from shared import dead_letters as dl
from shared.engine import partition_for
from shared.ordered_retries import DEFERRED_ATTEMPT, HELD_BEHIND, lane_key

ORIGINS = ("payments.settlement-requests", "orders", "inventory.reservations.v2-eu-west-1-primary-region-replicated-stream")
ERRORS = ("TimeoutError", "com.example.payments.gateway.client.UpstreamUnavailableException$RetryBudgetExhausted", "KeyError")


def long_id(run: str, n: int) -> str:
    """An id with no place to break: a URN-like prefix and two digests."""
    digest = hashlib.sha256(f"{run}-{n}".encode()).hexdigest()
    return f"urn:statefleet:dlq:{run}:{n}:{digest}{digest[::-1]}{'x' * 40}"


def trace(error_class: str, n: int) -> str:
    """An error message as long as a real stack trace, with an unbroken URL in it."""
    url = "https://payments-gateway.internal.example.com/api/v3/settlements/" + "a1b2c3d4" * 30
    frames = "".join(
        f"\n    at com.example.payments.SettlementWorker.process{i}(SettlementWorker.java:{100 + i})" for i in range(25)
    )
    return f"{error_class}: upstream did not answer for request #{n} to {url} within 5000 ms{frames}"


def letters(run: str, retry_topic: str, *, count: int, attempt: int, start: int = 0) -> list[dl.DeadLetter]:
    """``count`` dead letters spread over every (origin, error class) group, all at ``attempt``."""
    out = []
    for n in range(start, start + count):
        origin, error = ORIGINS[n % len(ORIGINS)], ERRORS[(n // len(ORIGINS)) % len(ERRORS)]
        now = dl.now_ms()
        out.append(
            dl.DeadLetter(
                id=long_id(run, n),
                key=f"customer-{n:06d}-{'k' * 80}".encode(),
                value=b'{"settlement_id": "' + str(n).encode() + b'", "amount": "12.50", "currency": "EUR"}',
                original_topic=origin,
                original_partition=n % 12,
                original_offset=9_182_736_450 + n,
                retry_topic=retry_topic,
                attempt=attempt,
                error_class=error,
                error_message=trace(error, n),
                first_failed_at=now - 3_600_000,
                failed_at=now,
                other_headers=[("traceparent", f"00-{'ab' * 16}-{'cd' * 8}-01".encode())],
            )
        )
    return out


#: The origin topic the console tests' retry scheduler keeps per-key order for (ordered retries).
ORDERED_ORIGIN = "ledger.postings"


def id_outside_lane_partition(base: str, key: bytes, partitions: int) -> str:
    """``base`` with a suffix that puts the id's own partition elsewhere than its lane's, where a
    letter of an ordered topic is kept: its message page opens only because reads by id look for
    it in every partition."""
    lane = partition_for(lane_key(ORDERED_ORIGIN, key), partitions)
    return next(f"{base}-{n}" for n in range(1000) if partition_for(f"{base}-{n}", partitions) != lane)


def blocked_key(
    head_id: str, key: bytes, retry_topic: str, *, held: int, head_attempt: int, error_class: str = ERRORS[1]
) -> list[dl.DeadLetter]:
    """A key of :data:`ORDERED_ORIGIN` blocked behind a head that fails at ``head_attempt`` (the
    fleet's last attempt parks it at once), then ``held`` records its consumer deferred behind it
    (``dlq.held.behind``, attempt 0: they have not failed), ids ``<head_id>.h<n>``."""
    now = dl.now_ms()

    def letter(dlq_id: str, n: int, attempt: int, other: list[tuple[str, bytes]]) -> dl.DeadLetter:
        return dl.DeadLetter(
            id=dlq_id,
            key=key,
            value=b'{"posting": ' + str(n).encode() + b', "amount": "40.00"}',
            original_topic=ORDERED_ORIGIN,
            original_partition=3,
            original_offset=5_550_000 + n,
            retry_topic=retry_topic,
            attempt=attempt,
            error_class=error_class,
            error_message=trace(error_class, n) if attempt else "",
            first_failed_at=now,
            failed_at=now,
            other_headers=other,
        )

    deferred = [(HELD_BEHIND, head_id.encode())]
    return [
        letter(head_id, 0, head_attempt, []),
        *(letter(f"{head_id}.h{n}", n, DEFERRED_ATTEMPT, deferred) for n in range(1, held + 1)),
    ]


def send(bootstrap: str, topic: str, batch: Iterable[dl.DeadLetter]) -> None:
    """Write the dead letters to ``topic``, each with its own headers."""

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        await producer.start()
        try:
            for letter in batch:
                await producer.send(topic, letter.value, key=letter.key, headers=letter.headers())
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(run())
