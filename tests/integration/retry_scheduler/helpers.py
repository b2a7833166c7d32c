"""Helpers for running the retry scheduler on the real broker in tests.

The policy differs by origin topic (through the overrides), so one process serves
tests that need fast retries and tests that need messages to stay scheduled:

- ``orders``: 300 ms, then 600 ms, then 1 s (capped), no jitter, 4 attempts
- ``slow``: 10 minutes
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson

from shared import dead_letters as dl
from shared.engine import partition_for
from tests.support.dead_letters import letter_headers as letter_headers  # re-exported for the tests here
from tests.support.environment import new_topic_prefix, service_environment, settings_env
from tests.support.kafka import Record, create_topics, produce, read_all
from tests.support.services import ServiceProcess, free_port, wait_for
from tools import web

TICK_S = 0.2
#: Partitions of the scheduler's topics (the settings' default).
PARTITIONS = 8
TOKEN = "test-admin-token"
OVERRIDES = {"origin_topic": {"slow": {"base_delay_ms": 600_000, "max_delay_ms": 600_000}}}


def scheduler_env(kafka_bootstrap: str, prefix: str, data_dir: Path, **settings: object) -> dict[str, str]:
    """A scheduler's environment with the policy above; ``settings`` add to it or change it, by
    lower-case setting name (as :func:`tests.support.environment.service_environment` takes them)."""
    policy: dict[str, object] = {
        "retry_tick_interval_s": TICK_S,
        "retry_max_attempts": 4,
        "retry_base_delay_ms": 300,
        "retry_max_delay_ms": 1000,
        "retry_jitter": "none",
        "retry_policy_overrides": orjson.dumps(OVERRIDES).decode(),
        "admin_token": TOKEN,
        "standby_replicas": 0,
    }
    return {**service_environment(kafka_bootstrap, prefix, data_dir), **settings_env(**{**policy, **settings})}


@dataclass
class Scheduler:
    """A running scheduler plus the helpers tests use against it."""

    proc: ServiceProcess
    prefix: str

    @property
    def url(self) -> str:
        return self.proc.url

    @property
    def dead_letters(self) -> str:
        return f"{self.prefix}dead-letters"

    @property
    def parking_lot(self) -> str:
        return f"{self.prefix}parking-lot"

    def retry_topic(self, name: str) -> str:
        topic = f"{self.prefix}retry-{name}"
        create_topics([topic])
        return topic

    def get(self, path: str, **params: object) -> httpx.Response:
        return web.get(self.url + path, params=params, timeout=10)  # type: ignore[arg-type]

    def admin(self, method: str, path: str, token: str | None = TOKEN) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return web.request(method, self.url + path, headers=headers, timeout=10)


def send_letter(s: Scheduler, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> None:
    produce(s.dead_letters, [(key, value)], headers=headers)


def records_for(topic: str, dlq_id: str) -> list[Record]:
    return [r for r in read_all(topic) if dict(r.headers).get(dl.ID) == dlq_id.encode()]


def new_id(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:8]}"


def wait_for_a_tick_everywhere(url: str) -> None:
    """Until every inbox partition has processed a tick from now on: what was due by now has been
    redelivered, and what was redelivered before is not again."""
    since = int(time.time() * 1000)

    def ticked() -> bool:
        ticks = web.get(url + "/retries/stats", timeout=10).json()["last_ticks"]
        return len({t["partition"] for t in ticks if t["at"] >= since}) == PARTITIONS

    wait_for(ticked, timeout=30, message="a tick of every inbox partition")


def send_end_marker(s: Scheduler, key: bytes, dlq_id: str, retry_topic: str) -> str:
    """Send, behind every letter sent so far with ``key``, a letter that stays scheduled on the
    inbox partition of ``dlq_id``; returns its id. Once it is scheduled, every letter for
    ``dlq_id`` sent before it with ``key`` has been read: they share a dead-letters partition
    and an inbox partition, each read in order."""
    inbox_partition = partition_for(dlq_id, PARTITIONS)
    marker = new_id("end")
    while partition_for(marker, PARTITIONS) != inbox_partition:
        marker = new_id("end")
    send_letter(s, key, b"end", letter_headers(marker, retry_topic, origin="slow"))
    return marker


@dataclass
class OwnTopics:
    """Topics of one test's own, and the environment of schedulers on a data dir the test may
    keep or delete between their starts."""

    dead_letters: str
    retry: str
    data: Path
    env: dict[str, str]


def own_topics(kafka_bootstrap: str, tmp_path: Path, retry_name: str, prefix: str | None = None) -> OwnTopics:
    """The topics of a test's own under ``prefix`` (pass the ``prefix`` fixture's, whose topics
    are deleted after the test; None: a new prefix whose topics the broker keeps)."""
    prefix = prefix or new_topic_prefix()
    dead, retry = f"{prefix}dead-letters", f"{prefix}retry-{retry_name}"
    create_topics([dead, retry, f"{prefix}parking-lot"])
    data = tmp_path / "data"
    return OwnTopics(dead, retry, data, scheduler_env(kafka_bootstrap, prefix, data))


def start_scheduler(env: dict[str, str], log_dir: Path, instance: str = "a", port: int | None = None) -> ServiceProcess:
    proc = ServiceProcess(
        "retry_scheduler",
        {**env, "STATEFLEET_INSTANCE_ID": instance},
        log_dir / f"retry-scheduler-{instance}-{uuid.uuid4().hex[:4]}.log",
        port=port or free_port(),
    )
    return proc.start().wait_ready()
