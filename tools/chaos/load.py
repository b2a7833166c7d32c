"""Sends the plan: commands over HTTP (any validator instance) or straight onto
``account-commands``, and poison bytes, logins and dead letters straight onto their
topics. Each chain is sent in order, its next step only once the previous one is
acknowledged; a step that fails (an instance or the broker just killed) is sent again
until it is acknowledged, the same command id each time."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import orjson

from shared.engine import partition_for
from shared.engine.clients import PlainProducer
from tools.chaos.plan import CommandStep, Plan, RecordStep, Step

#: HTTP failures of one command before it goes straight onto the topic instead.
HTTP_TRIES = 4


@dataclass(frozen=True)
class Topics:
    account_commands: str = "account-commands"
    logins: str = "logins"
    dead_letters: str = "dead-letters"


@dataclass
class LoadStats:
    sent: Counter[str] = field(default_factory=Counter)
    #: The headers each dead letter was sent with, by its value (``dlq.failed.at`` is set at sending).
    dead_letter_headers: dict[bytes, tuple[tuple[str, bytes], ...]] = field(default_factory=dict)
    #: The timestamp each dead letter was first sent with, by its value: a duplicate is the same
    #: record sent again (as a producer's retry sends it), timestamp included, whenever it comes.
    dead_letter_timestamps: dict[bytes, int] = field(default_factory=dict)


class Load:
    def __init__(
        self,
        plan: Plan,
        *,
        bootstrap: str,
        validator_urls: list[str],
        partitions: int,
        topics: Topics,
        duration_s: float,
        deadline_s: float,
    ) -> None:
        self.plan = plan
        self.bootstrap = bootstrap
        self.validator_urls = validator_urls
        self.partitions = partitions
        self.topics = topics
        self.duration_s = duration_s
        self.deadline = time.monotonic() + deadline_s
        self.stats = LoadStats()
        self.rng = random.Random(plan.seed * 7919 + 1)
        self.done_steps = 0
        self._producer: PlainProducer | None = None
        self._http: httpx.AsyncClient | None = None

    async def run(self) -> LoadStats:
        self._producer = PlainProducer(
            bootstrap_servers=self.bootstrap, acks="all", linger_ms=5, request_timeout_ms=15_000, retry_backoff_ms=250
        )
        await self._start_producer()
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=2.0), limits=httpx.Limits(max_connections=32))
        try:
            await asyncio.gather(*(self._chain(i, chain) for i, chain in enumerate(self.plan.chains)))
        finally:
            await self._http.aclose()
            await self._producer.stop()
        return self.stats

    async def _start_producer(self) -> None:
        assert self._producer is not None
        while True:
            try:
                await self._producer.start()
                return
            except Exception:  # the broker is not there yet
                self._check_deadline("starting the producer")
                await asyncio.sleep(1)

    def _check_deadline(self, what: str) -> None:
        if time.monotonic() > self.deadline:
            raise TimeoutError(f"the load could not finish in time ({what})")

    async def _chain(self, index: int, chain: list[Step]) -> None:
        # Seeded pacing: the chain's steps at random moments within most of the run.
        rng = random.Random(self.plan.seed * 1_000_003 + index)
        span = self.duration_s * rng.uniform(0.6, 0.95)
        start = time.monotonic()
        for step, due in zip(chain, sorted(rng.uniform(0, span) for _ in chain), strict=True):
            await asyncio.sleep(max(0.0, start + due - time.monotonic()))
            if isinstance(step, CommandStep):
                await self._send_command(step)
            else:
                await self._send_record(step)
            self.done_steps += 1

    async def _send_command(self, step: CommandStep) -> None:
        kind = "duplicate " if step.duplicate else ""
        if step.channel == "http":
            assert self._http is not None
            body = {k: v for k, v in step.command.items() if v is not None}
            for attempt in range(HTTP_TRIES):
                url = self.validator_urls[self.rng.randrange(len(self.validator_urls))]
                try:
                    response = await self._http.post(url + "/commands", json=body)
                except httpx.HTTPError:
                    response = None
                if response is not None and response.status_code in (200, 202):
                    self.stats.sent[f"{kind}commands over HTTP"] += 1
                    return
                if response is not None and response.status_code in (400, 413, 422):  # the plan's fault, not the fleet's
                    raise RuntimeError(
                        f"POST /commands refused a command of the plan: {response.status_code} {response.text[:300]} for {body}"
                    )
                self.stats.sent["HTTP attempts failed"] += 1
                await asyncio.sleep(0.3 * (attempt + 1))
            self.stats.sent["commands sent to Kafka after HTTP failed"] += 1
        key = step.command["account_id"].encode()
        await self._produce(self.topics.account_commands, key, orjson.dumps(step.command), ())
        self.stats.sent[f"{kind}commands onto account-commands"] += 1

    async def _send_record(self, step: RecordStep) -> None:
        headers = step.headers
        timestamp_ms: int | None = None
        if step.kind == "dead_letter":
            headers = self.stats.dead_letter_headers.get(step.value, headers)
            if step.value not in self.stats.dead_letter_headers:
                if step.failed_now:
                    headers = (*headers, ("dlq.failed.at", str(int(time.time() * 1000)).encode()))
                self.stats.dead_letter_headers[step.value] = headers
            timestamp_ms = self.stats.dead_letter_timestamps.setdefault(step.value, int(time.time() * 1000))
        topic = {"poison": self.topics.account_commands, "login": self.topics.logins, "dead_letter": self.topics.dead_letters}[
            step.kind
        ]
        await self._produce(topic, step.key, step.value, headers, timestamp_ms)
        self.stats.sent[f"{'duplicate ' if step.duplicate else ''}{step.kind.replace('_', ' ')}s"] += 1

    async def _produce(
        self, topic: str, key: bytes | None, value: bytes, headers: tuple[tuple[str, bytes], ...], timestamp_ms: int | None = None
    ) -> None:
        assert self._producer is not None
        partition = partition_for(key, self.partitions) if key is not None else self.rng.randrange(self.partitions)
        while True:
            try:
                await asyncio.wait_for(
                    self._producer.send_and_wait(
                        topic, value, key=key, partition=partition, headers=list(headers), timestamp_ms=timestamp_ms
                    ),
                    30,
                )
                return
            except Exception:  # the broker is down or moving: send it again (a duplicate at worst)
                self.stats.sent["Kafka sends retried"] += 1
                self._check_deadline(f"sending to {topic}")
                await asyncio.sleep(1)
