"""What the fleet wrote and answers: output topics read from the beginning with a plain
consumer, and the public HTTP APIs, asked for every id the load used."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from shared.engine.clients import KafkaTopicPartition, PlainConsumer, refresh_metadata

#: HTTP answers: the JSON body on 200, None on 404; anything else is an error string.
Answer = dict[str, Any] | None | str


@dataclass(frozen=True)
class Rec:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


@dataclass
class Observed:
    events: list[Rec] = field(default_factory=list)
    rejections: list[Rec] = field(default_factory=list)
    tallies: list[Rec] = field(default_factory=list)
    dead_letters: list[Rec] = field(default_factory=list)
    #: Every retry topic (``retry``, ``retry-<service>``) by name.
    retries: dict[str, list[Rec]] = field(default_factory=dict)
    parking_lot: list[Rec] = field(default_factory=list)
    commands_http: dict[str, Answer] = field(default_factory=dict)
    accounts_http: dict[str, Answer] = field(default_factory=dict)
    tallies_http: dict[str, Answer] = field(default_factory=dict)
    parked_http: dict[str, Answer] = field(default_factory=dict)


async def read_topics(
    bootstrap: str, topics: Iterable[str], timeout_s: float = 60.0, isolation_level: str = "read_uncommitted"
) -> dict[str, list[Rec]]:
    """Every record of each topic, from the beginning to the end offsets at the start of the read
    (with ``read_committed``: the committed records up to the last stable offsets)."""
    names = list(topics)
    consumer = PlainConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest", isolation_level=isolation_level
    )
    await consumer.start()
    try:
        await refresh_metadata(consumer)
        tps = [KafkaTopicPartition(t, p) for t in names for p in sorted(consumer.partitions_for_topic(t) or [])]
        out: dict[str, list[Rec]] = {t: [] for t in names}
        if not tps:
            return out
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        remaining = {tp for tp in tps if ends[tp] > 0}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while remaining:
            if loop.time() > deadline:
                raise TimeoutError(f"reading {sorted({tp.topic for tp in remaining})} took over {timeout_s:.0f}s")
            batch = await consumer.getmany(timeout_ms=500)
            for tp, msgs in batch.items():
                for m in msgs:
                    if m.offset < ends[tp]:
                        out[tp.topic].append(Rec(m.topic, m.partition, m.offset, m.key, m.value, tuple(m.headers)))
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        for records in out.values():
            records.sort(key=lambda r: (r.partition, r.offset))
        return out
    finally:
        await consumer.stop()


async def list_topics(bootstrap: str) -> set[str]:
    consumer = PlainConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        return set(await consumer.topics())
    finally:
        await consumer.stop()


async def ask_all(
    client: httpx.AsyncClient, urls: list[str], path: str, ids: Iterable[str], concurrency: int = 12
) -> dict[str, Answer]:
    """GET ``<url><path>/<id>`` for every id (any instance; another one if it fails)."""
    out: dict[str, Answer] = {}
    gate = asyncio.Semaphore(concurrency)
    rng = random.Random()

    async def one(item: str) -> None:
        async with gate:
            answer: Answer = "not asked"
            for attempt in range(3):
                url = urls[(rng.randrange(len(urls)) + attempt) % len(urls)]
                try:
                    response = await client.get(f"{url}{path}/{quote(item, safe='')}")
                except httpx.HTTPError as exc:
                    answer = f"{type(exc).__name__}: {exc}"
                    continue
                if response.status_code == 200:
                    out[item] = response.json()
                    return
                if response.status_code == 404:
                    out[item] = None
                    return
                answer = f"HTTP {response.status_code}: {response.text[:200]}"
            out[item] = answer

    await asyncio.gather(*(one(i) for i in ids))
    return out
