"""A user's consumer of an ordered topic, for the e2e tests of ordered retries: a process of its
own (``python -m tests.support.ordered_consumer``) that a test can SIGKILL, built on
:class:`shared.retry_client.OrderedRetryConsumer` as a user's consumer would be.

Each input value is JSON ``{"key", "seq", "fails", "waits"}``; ``fails`` says how its handler
fails, so that the test decides it when it produces the record and a restarted consumer fails
alike:

- absent: never;
- ``"first:N"``: its first N attempts (a redelivery's ``dlq.attempt`` counts the failed ones);
- ``"until:NAME"``: while the file NAME does not exist in ``--control-dir`` (the test creates it);
- ``"always"``: every time.

With ``"waits": NAME``, unless the file NAME exists in ``--control-dir``, the handler waits
before anything else until the process is told to stop (SIGTERM): a record still being
processed, so that a test can SIGKILL the consumer once it processed the records fetched with
it and before it commits their offsets (and then creates NAME for the consumer it restarts).

Each record takes ``--work-ms`` of the handler's time (a handler that does some work), so that
a SIGKILL lands in the middle of a fetched batch rather than between two.

A record processed is written to ``--output`` (key: the record's key; value: JSON ``{"key",
"seq", "attempt"}``) and acknowledged by the broker before the handler returns, so the output's
order per key is the order in which the consumer processed that key's records.

Connection settings and the topic prefix come from the ``STATEFLEET_*`` environment as for a
service; the topic arguments are full names.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path

import orjson

from shared.dead_letters import ATTEMPT, header_items
from shared.engine.clients import PlainProducer, client_kwargs
from shared.ordered_retries import header
from shared.retry_client import ConsumedRecord, OrderedRetryConsumer
from shared.settings import Settings

log = logging.getLogger("ordered_consumer")


class FailureInjected(RuntimeError):
    """The failure a record's ``fails`` asked for."""


def failed_attempts(record: ConsumedRecord) -> int:
    """How many times this record failed before: a redelivery carries it in ``dlq.attempt``
    (0 for a record redelivered after waiting behind its key's head); a first delivery, none."""
    attempt = header(header_items(record.headers), ATTEMPT)
    return int(attempt) if attempt else 0


def must_fail(fails: str | None, attempts: int, control_dir: Path) -> bool:
    if not fails:
        return False
    if fails == "always":
        return True
    kind, _, arg = fails.partition(":")
    if kind == "first":
        return attempts < int(arg)
    if kind == "until":
        return not (control_dir / arg).exists()
    raise ValueError(f"unknown failure mode {fails!r}")


class OutputHandler:
    """The user's handler: fail as the record asks, else write (key, seq) to the output topic."""

    def __init__(
        self, producer: PlainProducer, output_topic: str, control_dir: Path, work_s: float, stopping: asyncio.Event
    ) -> None:
        self.producer = producer
        self.stopping = stopping
        self.output_topic = output_topic
        self.control_dir = control_dir
        self.work_s = work_s

    async def __call__(self, record: ConsumedRecord) -> None:
        await asyncio.sleep(self.work_s)
        body = orjson.loads(record.value or b"{}")
        if body.get("waits") and not (self.control_dir / body["waits"]).exists():
            log.info("%s#%s waits until the consumer stops", body["key"], body["seq"])
            await self.stopping.wait()
        attempts = failed_attempts(record)
        if must_fail(body.get("fails"), attempts, self.control_dir):
            raise FailureInjected(f"{body['key']}#{body['seq']} fails ({body['fails']}, attempt {attempts + 1})")
        out = orjson.dumps({"key": body["key"], "seq": body["seq"], "attempt": attempts})
        await self.producer.send_and_wait(self.output_topic, out, key=record.key)
        log.info("processed %s#%s from %s@%s", body["key"], body["seq"], record.topic, record.offset)


async def run(args: argparse.Namespace) -> None:
    settings = Settings()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    producer = PlainProducer(acks="all", enable_idempotence=True, **client_kwargs(settings))
    await producer.start()
    try:
        consumer = OrderedRetryConsumer(
            settings,
            topic=args.topic,
            retry_topic=args.retry_topic,
            group_id=args.group,
            handler=OutputHandler(producer, args.output, Path(args.control_dir), args.work_ms / 1000, stop),
        )
        await consumer.run(stop)
    finally:
        await producer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topic", required=True)
    parser.add_argument("--retry-topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--control-dir", required=True)
    parser.add_argument("--work-ms", type=float, default=0.0)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
