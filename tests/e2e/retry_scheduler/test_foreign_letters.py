"""Dead letters from other producers, on the real broker with the scheduler as a process
(``docs/dead-letter-protocol.md``): a Spring Kafka consumer that fails every time and sends each
redelivery back with the headers it got plus its own ``kafka_dlt-*`` ones, redelivered to its
origin topic as its policy says; a consumer that sends no headers at all; both parked after
their attempts, nothing vanishing as a duplicate and nothing looping. A Kafka Connect dead letter
is scheduled with the origin and error its headers give."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from shared import dead_letters as dl
from tests.integration.retry_scheduler.helpers import scheduler_env, start_scheduler
from tests.support.dead_letters import connect_headers, spring_headers
from tests.support.kafka import Record, create_topics, produce, read_all
from tests.support.services import wait_for
from tools import web

pytestmark = pytest.mark.e2e

MAX_ATTEMPTS = 3


def test_spring_and_headerless_re_failures_are_counted_until_parked(kafka_bootstrap: str, prefix: str, tmp_path: Path) -> None:
    dead, retry, parking, payments = (f"{prefix}{name}" for name in ("dead-letters", "retry", "parking-lot", "payments"))
    create_topics([dead, retry, parking, payments, f"{prefix}clicks"])
    overrides = {
        "origin_topic": {"payments": {"redeliver_to": "origin"}, "clicks": {"base_delay_ms": 600_000, "max_delay_ms": 600_000}}
    }
    env = scheduler_env(
        kafka_bootstrap,
        prefix,
        tmp_path / "data",
        retry_max_attempts=MAX_ATTEMPTS,
        retry_base_delay_ms=200,
        retry_max_delay_ms=400,
        retry_policy_overrides=orjson.dumps(overrides).decode(),
    )
    spring_id = dl.content_id(payments, b"order-7", b"pay")
    bare_id = dl.content_id(dead, b"k", b"bare")

    def of(topic: str, dlq_id: str) -> list[Record]:
        return [r for r in read_all(topic) if dict(r.headers).get(dl.ID) == dlq_id.encode()]

    proc = start_scheduler(env, tmp_path)
    try:
        produce(
            dead,
            [(b"order-7", b"pay")],
            headers=spring_headers(payments, 2, 70, dl.SPRING_WRAPPER, "failed", "java.net.SocketTimeoutException"),
        )
        produce(dead, [(b"k", b"bare")])
        produce(
            dead,
            [(b"c", b"click")],
            headers=connect_headers(f"{prefix}clicks", 1, 42, "org.apache.kafka.connect.errors.DataException", "bad"),
        )
        for attempt in range(1, MAX_ATTEMPTS):
            got = wait_for(
                lambda n=attempt: len(r := of(payments, spring_id)) >= n and r, timeout=30, message=f"spring redelivery {attempt}"
            )
            again = got[-1]
            assert dict(again.headers)[dl.ATTEMPT] == str(attempt).encode()
            # Spring fails again: the consumed record's headers as they were, then its own.
            failure = spring_headers(
                payments, again.partition, again.offset, "java.lang.IllegalStateException", f"failed {attempt}"
            )
            produce(dead, [(again.key, again.value)], headers=[*again.headers, *failure])
            wait_for(
                lambda n=attempt: len([r for r in read_all(retry) if r.value == b"bare"]) >= n,
                timeout=30,
                message=f"bare redelivery {attempt}",
            )
            produce(dead, [(b"k", b"bare")])  # fails again, and writes no headers at all

        def parked(dlq_id: str) -> dict | None:  # type: ignore[type-arg]
            answer = web.get(f"{proc.url}/parked/{dlq_id}", timeout=10)
            return answer.json() if answer.status_code == 200 else None

        spring_parked = wait_for(lambda: parked(spring_id), timeout=30, message="the spring letter parked")
        assert spring_parked["attempt"] == MAX_ATTEMPTS and spring_parked["origin_topic"] == payments
        assert spring_parked["origin_offset"] == 70 and spring_parked["error_class"] == "java.lang.IllegalStateException"
        bare_parked = wait_for(lambda: parked(bare_id), timeout=30, message="the header-less letter parked")
        assert bare_parked["attempt"] == MAX_ATTEMPTS and bare_parked["origin_topic"] == dead
        assert [dict(r.headers)[dl.ATTEMPT] for r in of(payments, spring_id)] == [b"1", b"2"]
        assert len([r for r in read_all(retry) if r.value == b"bare"]) == MAX_ATTEMPTS - 1
        assert len(of(parking, spring_id)) == 1 and len(of(parking, bare_id)) == 1

        click = web.get(f"{proc.url}/retries/{dl.content_id(f'{prefix}clicks', b'c', b'click')}", timeout=10).json()
        assert (click["origin_topic"], click["origin_partition"], click["origin_offset"]) == (f"{prefix}clicks", 1, 42)
        assert (click["error_class"], click["error_message"]) == ("org.apache.kafka.connect.errors.DataException", "bad")
        assert click["retry_topic"] == retry and click["attempt"] == 1
    finally:
        proc.kill()
