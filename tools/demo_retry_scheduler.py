"""Demo: a poison message goes round its retries into the parking lot, watched over HTTP.

    python -m tools.demo_retry_scheduler [--base-url http://127.0.0.1:8003] [--token ...]

A consumer of ``demo-orders`` fails on a message and dead-letters it. The demo plays
that consumer: it reads the retry topic and fails again on every redelivery, writing a
new dead letter with the same ``dlq.id`` and one more attempt (``dead_letter_for``),
until the scheduler parks the message. The scheduler's HTTP API shows each step. Then
the message is replayed from the parking lot with the admin token, and this time the
consumer (its bug fixed) processes it.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

import httpx

from shared import dead_letters as dl
from shared.engine.clients import KafkaTopicPartition, PlainConsumer, PlainProducer, client_kwargs, refresh_metadata
from shared.settings import get_settings
from shared.topics import topic_names

ORIGIN = "demo-orders"
TIMEOUT_S = 180.0


class PoisonMessageError(ValueError):
    """What the demo consumer raises on the poison message."""


def say(text: str) -> None:
    print(f"[retry demo] {text}", flush=True)


def _headers(record: Any) -> dict[str, str]:
    return {k: v.decode("utf-8", errors="replace") for k, v in record.headers}


async def _demo(base_url: str, admin_token: str) -> None:
    settings = get_settings()
    topics = topic_names(settings)
    dlq_id = f"demo-poison-{uuid.uuid4().hex[:8]}"
    key, value = b"order-42", b'{"order_id": "order-42", "amount": "forty-two"}'
    http = httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=10)
    producer = PlainProducer(**client_kwargs(settings), acks="all")
    consumer = PlainConsumer(**client_kwargs(settings), enable_auto_commit=False)
    await producer.start()
    await consumer.start()
    try:
        stats = (await http.get("/retries/stats")).json()
        say(f"policy in force: {stats['policy']['default']}")
        await refresh_metadata(consumer)
        tps = [KafkaTopicPartition(topics.retry, p) for p in sorted(consumer.partitions_for_topic(topics.retry) or [0])]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        for tp in tps:
            await consumer.position(tp)

        now = dl.now_ms()
        first = dl.DeadLetter(
            id=dlq_id,
            key=key,
            value=value,
            original_topic=ORIGIN,
            original_partition=0,
            original_offset=42,
            retry_topic=topics.retry,
            attempt=1,
            error_class="PoisonMessageError",
            error_message="'amount' is not a number",
            first_failed_at=now,
            failed_at=now,
            other_headers=[("traceparent", b"00-demo-01")],
        )
        await producer.send_and_wait(topics.dead_letters, first.value, key=first.key, headers=first.headers())
        say(f"consumer of {ORIGIN} failed on {key.decode()}: dead letter {dlq_id} attempt 1 -> {topics.dead_letters}")

        deadline = time.monotonic() + TIMEOUT_S
        shown: set[int] = set()
        parked: dict[str, Any] | None = None
        while parked is None and time.monotonic() < deadline:
            r = await http.get(f"/retries/{dlq_id}")
            if r.status_code == 200:
                entry = r.json()
                if entry["attempt"] not in shown:
                    shown.add(entry["attempt"])
                    wait = max(0, entry["due_at"] - dl.now_ms())
                    say(
                        f"  GET /retries/{dlq_id}: attempt {entry['attempt']} of {entry['max_attempts']}, "
                        f"redelivered to {entry['retry_topic']} in {wait} ms"
                    )
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for record in records:
                    headers = _headers(record)
                    if headers.get(dl.ID) != dlq_id:
                        continue
                    attempt = int(headers[dl.ATTEMPT])
                    say(f"  redelivered on {record.topic} (dlq.attempt={attempt}); the consumer fails again")
                    letter = dl.dead_letter_for(
                        record.key,
                        record.value,
                        record.headers,
                        topic=record.topic,
                        partition=record.partition,
                        offset=record.offset,
                        error=PoisonMessageError("'amount' is not a number"),
                        retry_topic=topics.retry,
                    )
                    await producer.send_and_wait(topics.dead_letters, letter.value, key=letter.key, headers=letter.headers())
                    say(f"  dead letter {dlq_id} attempt {letter.attempt} -> {topics.dead_letters}")
            r = await http.get(f"/parked/{dlq_id}")
            if r.status_code == 200:
                parked = r.json()
        if parked is None:
            say(f"gave up after {TIMEOUT_S:.0f}s: {dlq_id} was not parked (is the retry scheduler at {base_url}?)")
            return
        say(f"parked: GET /parked/{dlq_id} -> attempt {parked['attempt']}, reason: {parked['parked_reason']}")
        listing = (await http.get("/parked", params={"limit": 1000})).json()
        say(
            f"GET /parked lists {len(listing['items'])} message(s), ours among them: "
            f"{any(i['id'] == dlq_id for i in listing['items'])}"
        )
        stats = (await http.get("/retries/stats")).json()
        say(
            f"GET /retries/stats: {stats['scheduled']} scheduled, {stats['parked']} parked, "
            f"lateness p50 {stats['lateness']['p50_ms']} ms / p99 {stats['lateness']['p99_ms']} ms"
        )

        r = await http.post(f"/parked/{dlq_id}/replay")
        say(f"POST /parked/{dlq_id}/replay without the token -> {r.status_code} {r.json()['error']}")
        r = await http.post(f"/parked/{dlq_id}/replay", headers={"Authorization": f"Bearer {admin_token}"})
        say(f"POST /parked/{dlq_id}/replay with the token -> {r.status_code} {r.json()}")
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            done = [rec for records in batch.values() for rec in records if _headers(rec).get(dl.ID) == dlq_id]
            if done:
                say(
                    f"  redelivered again (dlq.attempt={_headers(done[0])[dl.ATTEMPT]}); with the bug fixed the "
                    f"consumer processes {done[0].key.decode() if done[0].key else ''}: done"
                )
                break
    finally:
        await consumer.stop()
        await producer.stop()
        await http.aclose()


def run(base_url: str, admin_token: str) -> None:
    """Produce a poison message and print it going round its retries into the parking lot."""
    asyncio.run(_demo(base_url, admin_token))


def main() -> None:
    settings = get_settings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--base-url", default=f"http://127.0.0.1:{settings.port_for(8003)}")
    parser.add_argument("--token", default=settings.admin_token)
    args = parser.parse_args()
    run(args.base_url, args.token)


if __name__ == "__main__":
    main()
