"""The chaos run on a cluster of KRaft nodes (``--brokers N``, N > 1): the node that leads the
most of the fleet's partitions (sometimes the node coordinating a service's consumer group or
one of its transactions) SIGKILLed, started again a few seconds later, again and again; and
what each leader move costs, measured while it happens:

- the validator's longest processing pause: the longest time its consumer group's committed
  offsets on ``account-commands`` did not move while records were waiting there (under
  exactly_once they move with each batch's transaction; under at_least_once with the worker's
  periodic commit, every few seconds, which the figure then includes);
- failed reads: reads of accounts (``GET /accounts/<id>``) asked of either validator instance
  every half second, a read failing when neither instance answered it; and the longest time
  reads kept failing.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote

import httpx

from shared.engine.clients import KafkaTopicPartition, PlainConsumer, refresh_metadata
from tools import kafka_broker

#: Every service's consumer group (``app_id`` with the chaos run's empty topic prefix) and an
#: input topic whose partition 0's transactional id names one of its transactions.
GROUPS = {
    "statefleet-validator": "account-commands",
    "statefleet-tallies": "account-events",
    "statefleet-retry-scheduler": "dead-letters",
}

#: How often the pause watcher and the read probe look.
WATCH_EVERY_S = 0.5


@dataclass
class NodeFaults:
    kills: int = 0
    #: Why each victim was chosen: "most leaders", "group coordinator", "transaction coordinator".
    reasons: Counter[str] = field(default_factory=Counter)
    log: list[str] = field(default_factory=list)


async def choose_victim(bootstrap: str, nodes: list[int], rng: random.Random, exactly_once: bool) -> tuple[int, str]:
    """The node to kill next and why: most of the time the one leading the most partitions of
    the fleet's topics, sometimes the coordinator of a service's group or (exactly_once) of one
    of its transactions."""
    group = rng.choice(sorted(GROUPS))
    roll = rng.random()
    txn_id = f"{group}.{GROUPS[group]}.0" if exactly_once and roll >= 0.8 else None
    topics = await fleet_topics(bootstrap)
    found = await kafka_broker.partition_leaders_async(
        bootstrap, topics, group=group if 0.6 <= roll < 0.8 else None, transactional_id=txn_id
    )
    if found.transaction_coordinator is not None and found.transaction_coordinator in nodes:
        return found.transaction_coordinator, "transaction coordinator"
    if found.group_coordinator is not None and found.group_coordinator in nodes:
        return found.group_coordinator, "group coordinator"
    led = Counter(leader for leader in found.leaders.values() if leader in nodes)
    if not led:
        return rng.choice(nodes), "at random (no leaders known)"
    most = max(led.values())
    return rng.choice(sorted(node for node, n in led.items() if n == most)), "most leaders"


async def fleet_topics(bootstrap: str) -> list[str]:
    consumer = PlainConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        return sorted(t for t in await consumer.topics() if not t.startswith("__"))
    finally:
        await consumer.stop()


def kill_and_restart(layout: kafka_broker.BrokerLayout, node_id: int, down_s: float, say: Callable[[str], None]) -> None:
    """SIGKILL node ``node_id``, and start it again on its storage ``down_s`` later (blocking)."""
    pid = kafka_broker.kill_node(layout, node_id)
    say(f"SIGKILL broker node {node_id} (pid {pid}); starting it again in {down_s:.0f}s")
    time.sleep(down_s)
    kafka_broker.start_node(layout, node_id, wait_s=180.0)
    say(f"broker node {node_id} is back")


@dataclass
class PauseWatch:
    """The validator's longest processing pause (see the module docs)."""

    bootstrap: str
    group: str = "statefleet-validator"
    topic: str = "account-commands"
    longest_s: float = 0.0
    longest_at: float = 0.0
    _since: float | None = None

    async def run(self, stop_at: float, started: float) -> None:
        consumer: PlainConsumer | None = None
        last_committed = -1
        try:
            while time.monotonic() < stop_at:
                try:
                    if consumer is None:
                        consumer = PlainConsumer(bootstrap_servers=self.bootstrap, group_id=self.group, enable_auto_commit=False)
                        await consumer.start()
                        await refresh_metadata(consumer)
                    tps = [KafkaTopicPartition(self.topic, p) for p in sorted(consumer.partitions_for_topic(self.topic) or [])]
                    async with asyncio.timeout(5):
                        ends = await consumer.end_offsets(tps)
                        committed = {tp: await consumer.committed(tp) or 0 for tp in tps}
                except Exception:  # a node down or the coordinator moving: the pause goes on meanwhile
                    ends, committed = {}, {}
                now = time.monotonic()
                total = sum(committed.values()) if committed else last_committed
                waiting = any(ends[tp] > committed[tp] for tp in ends) if ends else self._since is not None
                if total != last_committed or not waiting:
                    self._since = None
                elif self._since is None:
                    self._since = now
                if self._since is not None and now - self._since > self.longest_s:
                    self.longest_s, self.longest_at = now - self._since, self._since - started
                last_committed = total
                await asyncio.sleep(WATCH_EVERY_S)
        finally:
            if consumer is not None:
                await consumer.stop()


@dataclass
class ReadProbe:
    """Reads of accounts asked of the validator instances while the faults go on (see the module docs)."""

    urls: list[str]
    accounts: list[str]
    reads: int = 0
    failed: int = 0
    longest_failing_s: float = 0.0
    _failing_since: float | None = None

    async def run(self, stop_at: float) -> None:
        rng = random.Random(5)
        async with httpx.AsyncClient(timeout=httpx.Timeout(3.0, connect=1.0)) as client:
            while time.monotonic() < stop_at:
                account = rng.choice(self.accounts)
                ok = False
                for url in rng.sample(self.urls, len(self.urls)):
                    try:
                        response = await client.get(f"{url}/accounts/{quote(account, safe='')}")
                    except httpx.HTTPError:
                        continue
                    if response.status_code in (200, 404):
                        ok = True
                        break
                self.reads += 1
                now = time.monotonic()
                if ok:
                    self._failing_since = None
                else:
                    self.failed += 1
                    if self._failing_since is None:
                        self._failing_since = now
                    self.longest_failing_s = max(self.longest_failing_s, now - self._failing_since)
                await asyncio.sleep(WATCH_EVERY_S)
