"""Validator benchmark: commands/s of one worker, and the latency from producing a
command to its event being readable, each next to bare aiokafka in the same run.

    python -m tools.bench validator --commands 100000 --rates 10000,2000 --seconds 10

Throughput: N commands (accounts of five commands each: a create and four updates,
half of them with expected_version) are pre-loaded onto ``<prefix>account-commands``;
one worker starts on an empty data dir and decides the backlog. The rate is the
number of events over the span between the first and the last event's broker
timestamp. Every event is checked: versions 1..5 per account, no rejection. The
baseline produces the same number of records with a bare AIOKafkaProducer and reads
them back with a bare AIOKafkaConsumer.

Cold restart (``--stored N``, instead of the above): N accounts created, one command each,
decided by one worker (its ``accounts``, ``program-accounts`` and ``outcomes`` tables then
hold N keys each); the worker is stopped and started again on its data dir (warm), then on
an empty one (cold): the time to /readyz 200, the restore's records/s from the worker's
metrics (``statefleet_restored_records_total`` over ``statefleet_restore_seconds``) and the
bulk restore's own from its log, next to a bare aiokafka consumer reading the same
changelogs just before. 2,000 accounts, spread evenly, are then read back from the
cold-started worker.

Latency: with the worker idle, commands are produced at a fixed rate (paced every
10 ms) for a few seconds; a bare consumer tails ``account-events``, and each event's
latency is its arrival time minus its command's send time (one process, one clock).
The baseline does the same produce-then-consume round trip through a plain topic with
no worker in between. Producer, consumer and worker share the machine (and its cores)
with the broker, as they would in a small deployment.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from shared.engine import app_id
from shared.engine.clients import TopicSpec, ensure_topics_async, refresh_metadata
from shared.settings import Settings
from tools import web
from tools.bench import results
from tools.bench.common import (
    REPO,
    Instance,
    bootstrap,
    last_bulk_restore,
    machine,
    produce_bulk,
    raw_consume_rate,
    restore_figures,
    service_worker,
    topic_size,
)

COMMANDS_PER_ACCOUNT = 5
#: The backlog the table's figures are of (``--commands``).
BACKLOG = 100_000
ISSUED = 1_700_000_000_000


def backlog(n: int, per_account: int = COMMANDS_PER_ACCOUNT) -> Iterator[tuple[bytes, bytes]]:
    """``n`` commands, round-robin over accounts so consecutive ones touch different accounts:
    ``per_account`` each (a create, then updates)."""
    accounts = max(1, n // per_account)
    made = 0
    for step in range(per_account):
        for a in range(accounts):
            if made == n:
                return
            account = f"acct-{a}"
            body: dict[str, Any] = {"command_id": f"{account}-{step}", "account_id": account, "issued_at": ISSUED + step}
            if step == 0:
                body |= {"type": "CreateAccount", "program_id": f"program-{a % 500}", "data": {"name": account}}
            else:
                body |= {"type": "UpdateAccount", "data": {"step": step}}
                if a % 2 == 0:
                    body["expected_version"] = step
            made += 1
            yield account.encode(), orjson.dumps(body)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def tail_consumer(topic: str) -> AIOKafkaConsumer:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap(), enable_auto_commit=False, fetch_max_wait_ms=5)
    await consumer.start()
    await refresh_metadata(consumer)
    tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
    consumer.assign(tps)
    await consumer.seek_to_end(*tps)
    for tp in tps:
        await consumer.position(tp)
    return consumer


async def paced_round_trip(
    produce_topic: str, consume_topic: str, rate: int, seconds: float, make: Any, id_of: Any
) -> tuple[list[float], float]:
    """Produce ``rate``/s for ``seconds`` to one topic and time each record's echo on another.

    ``make(i)`` gives (id, key, value) for the i-th record; ``id_of(value)`` reads the id
    back from a consumed record. Returns the latencies (ms) and the achieved send rate.
    """
    consumer = await tail_consumer(consume_topic)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap(), linger_ms=1, acks=1)
    await producer.start()
    sent: dict[str, float] = {}
    latencies: list[float] = []
    total = int(rate * seconds)
    done = asyncio.Event()

    async def consume() -> None:
        deadline = None
        while len(latencies) < total:
            batch = await consumer.getmany(timeout_ms=100)
            now = time.perf_counter()
            for msgs in batch.values():
                for m in msgs:
                    t = sent.get(id_of(m.value))
                    if t is not None:
                        latencies.append((now - t) * 1000)
            if done.is_set():
                deadline = deadline or now + 15
                if now > deadline:
                    break

    reader = asyncio.create_task(consume())
    tick = 0.01
    per_tick = max(1, round(rate * tick))
    started = time.perf_counter()
    i = 0
    try:
        while i < total:
            target = started + (i / rate)
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            for _ in range(min(per_tick, total - i)):
                rid, key, value = make(i)
                sent[rid] = time.perf_counter()
                await producer.send(produce_topic, value, key=key)
                i += 1
        achieved = total / (time.perf_counter() - started)
        await producer.flush()
        done.set()
        await reader
    finally:
        await producer.stop()
        await consumer.stop()
    return latencies, achieved


def latency_commands(run: str) -> Any:
    def make(i: int) -> tuple[str, bytes, bytes]:
        account, command_id = f"{run}-{i}", f"{run}-{i}-c"
        body = {
            "command_id": command_id,
            "type": "CreateAccount",
            "account_id": account,
            "program_id": "lat",
            "issued_at": int(time.time() * 1000),
            "data": {},
        }
        return command_id, account.encode(), orjson.dumps(body)

    return make


def summary(name: str, lat: list[float], expected: int, achieved: float) -> str:
    if not lat:
        return f"{name}: no records came back"
    return (
        f"{name}: sent {achieved:,.0f}/s, {len(lat):,}/{expected:,} back; latency p50 {statistics.median(lat):.1f} ms, "
        f"p99 {percentile(lat, 0.99):.1f} ms, max {max(lat):.1f} ms"
    )


def metric_totals(url: str) -> dict[str, int]:
    """``statefleet_messages_processed_total`` of every stream of the worker (one GET /metrics)."""
    totals: dict[str, int] = {}
    head = 'statefleet_messages_processed_total{service="validator",stream="'
    for line in web.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(head):
            stream = line[len(head) :].split('"', 1)[0]
            totals[stream] = totals.get(stream, 0) + int(float(line.rsplit(" ", 1)[1]))
    return totals


def metric_total(url: str, stream: str = "commands") -> int:
    return metric_totals(url).get(stream, 0)


def wait_decided(url: str, n: int, report: bool = False) -> None:
    started = last_report = time.perf_counter()
    while (done := metric_total(url)) < n:
        if time.perf_counter() - started > 900:
            raise TimeoutError(f"the worker decided {done:,} of {n:,} commands in 15 minutes")
        time.sleep(0.5)
        if report and time.perf_counter() - last_report > 10:
            last_report = time.perf_counter()
            print(f"[bench]   worker decided {done:,}/{n:,}", flush=True)


class CaughtUp(threading.Thread):
    """Polls the worker's counters every ``every_s`` and notes when each stream first counted ``n``
    records (wall clock, comparable with the broker's timestamps on this machine)."""

    STREAMS = ("outcomes", "events", "by-program")

    def __init__(self, url: str, n: int, every_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.url, self.n, self.every_s = url, n, every_s
        self.reached: dict[str, float] = {}
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set() and len(self.reached) < len(self.STREAMS):
            totals = metric_totals(self.url)
            for stream in self.STREAMS:
                if stream not in self.reached and totals.get(stream, 0) >= self.n:
                    self.reached[stream] = time.time()
            self.stopped.wait(self.every_s)

    def wait(self, timeout_s: float = 900) -> dict[str, float]:
        self.join(timeout_s)
        self.stopped.set()
        if len(self.reached) < len(self.STREAMS):
            raise TimeoutError(f"the outcome and projection handlers did not catch up within {timeout_s:.0f}s")
        return self.reached


def wait_idle(url: str, n: int) -> float:
    """Until the outcome and projection handlers have caught up with ``n`` commands; returns the seconds waited."""
    started = time.perf_counter()
    while any(metric_total(url, s) < n for s in ("outcomes", "events", "by-program")):
        if time.perf_counter() - started > 900:
            raise TimeoutError("the outcome and projection handlers did not catch up within 15 minutes")
        time.sleep(0.5)
    return time.perf_counter() - started


async def read_events(topic: str, expected: int) -> list[tuple[int, bytes]]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap(),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    await consumer.start()
    try:
        await refresh_metadata(consumer)
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        out: list[tuple[int, bytes]] = []
        idle = 0
        while len(out) < expected and idle < 20:
            batch = await consumer.getmany(timeout_ms=500, max_records=10_000)
            idle = 0 if batch else idle + 1
            for msgs in batch.values():
                out.extend((m.timestamp, m.value) for m in msgs)
        return out
    finally:
        await consumer.stop()


async def _batch_round(http: aiohttp.ClientSession, url: str, size: int, run: str) -> tuple[float, list[float]]:
    """One batch of ``size`` creates: POST /commands/batch, then GET /batches/{id} every 10 ms.
    Returns the seconds until every outcome was readable, and each item's (ms)."""
    batch_id = f"{run}-batch"
    body = {
        "batch_id": batch_id,
        "commands": [{"type": "CreateAccount", "account_id": f"{run}-b{i}", "program_id": "bench"} for i in range(size)],
    }
    started = time.perf_counter()
    async with http.post(f"{url}/commands/batch", json=body) as resp:
        if resp.status != 202:
            raise RuntimeError(f"batch {batch_id}: {resp.status} {(await resp.text())[:200]}")
    seen: dict[int, float] = {}
    while len(seen) < size:
        async with http.get(f"{url}/batches/{batch_id}", params={"limit": "1000"}) as page:
            body_read = await page.read() if page.status == 200 else None
        now = time.perf_counter()
        if body_read is not None:
            for item in orjson.loads(body_read)["items"]:
                if item["status"] != "pending":
                    seen.setdefault(item["index"], (now - started) * 1000)
        if now - started > 60:
            raise RuntimeError(f"batch {batch_id}: {len(seen)}/{size} outcomes readable after 60 s")
        await asyncio.sleep(0.01)
    return time.perf_counter() - started, list(seen.values())


async def _singles_round(http: aiohttp.ClientSession, url: str, size: int, run: str) -> tuple[float, list[float]]:
    """``size`` single creates sent at once, each POST /commands?wait=true (it answers once the
    outcome is readable). Returns the seconds until the last answered, and each one's (ms)."""
    started = time.perf_counter()

    async def one(i: int) -> float:
        command = {"type": "CreateAccount", "account_id": f"{run}-s{i}", "program_id": "bench"}
        async with http.post(f"{url}/commands", params={"wait": "true"}, json=command) as resp:
            if resp.status != 200:
                raise RuntimeError(f"single command {i}: {resp.status} {(await resp.text())[:200]}")
            await resp.read()
        return (time.perf_counter() - started) * 1000

    latencies = await asyncio.gather(*(one(i) for i in range(size)))
    return time.perf_counter() - started, list(latencies)


async def batch_against_singles(url: str, size: int, rounds: int) -> None:
    """POST to every outcome readable: one batch of ``size`` commands next to ``size`` single commands.

    The client is aiohttp: httpx's connection pool itself took about 10 s for 1,000 concurrent
    requests to this service's /healthz, which aiohttp sent in 0.7 s."""
    connector = aiohttp.TCPConnector(limit=200)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as http:
        timings: dict[str, tuple[list[float], list[float]]] = {"batch": ([], []), "singles": ([], [])}
        for round_no in range(rounds):
            run = f"b{round_no}-{uuid.uuid4().hex[:6]}"
            for kind, measure in (("batch", _batch_round), ("singles", _singles_round)):
                total, items = await measure(http, url, size, f"{run}-{kind}")
                timings[kind][0].append(total)
                timings[kind][1].extend(items)
        for kind, (totals, items) in timings.items():
            label = f"one batch of {size:,}" if kind == "batch" else f"{size:,} single commands at once"
            print(
                f"[bench] {label}: every outcome readable after {statistics.median(totals):.2f}s (median of "
                f"{rounds}; {min(totals):.2f}-{max(totals):.2f}s); per item p50 {percentile(items, 0.5):.0f} ms, "
                f"p99 {percentile(items, 0.99):.0f} ms",
                flush=True,
            )
        ratio = statistics.median(timings["singles"][0]) / statistics.median(timings["batch"][0])
        print(f"[bench] batch / singles: every outcome readable {ratio:.2f}x sooner with the batch", flush=True)
        results.record(
            "validator.batch_readable",
            statistics.median(timings["batch"][0]),
            "s",
            baseline=statistics.median(timings["singles"][0]),
        )


def cold_restart(stored: int, port: int, extra_env: dict[str, str]) -> None:
    """The ``--stored`` run (see the module docs)."""
    prefix = f"bench{uuid.uuid4().hex[:8]}."
    settings = Settings(kafka_bootstrap_servers=bootstrap(), topic_prefix=prefix)
    commands_topic = f"{prefix}account-commands"
    print(f"[bench] machine: {machine()}; prefix {prefix}; {stored:,} accounts", flush=True)
    asyncio.run(ensure_topics_async(settings, [TopicSpec(commands_topic, 8), TopicSpec(f"{prefix}account-events", 8)]))
    asyncio.run(produce_bulk(commands_topic, backlog(stored, per_account=1)))
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "STATEFLEET_TOPIC_PREFIX": prefix,
        "STATEFLEET_KAFKA_BOOTSTRAP_SERVERS": bootstrap(),
        "STATEFLEET_LOG_LEVEL": "INFO",
        "STATEFLEET_BULK_RESTORE": "true",
        **extra_env,
    }
    with tempfile.TemporaryDirectory() as tmp:
        worker = Instance("validator", port, Path(tmp) / "data", env, module="validator")
        started = time.perf_counter()
        worker.start().wait_ready()
        wait_decided(worker.url, stored, report=True)
        wait_idle(worker.url, stored)
        print(f"[bench] {stored:,} accounts created and their outcomes kept in {time.perf_counter() - started:.1f}s", flush=True)
        worker.stop()
        changelogs = [f"{app_id('validator', settings)}-{t}-changelog" for t in ("accounts", "program-accounts", "outcomes")]
        records = sum(asyncio.run(topic_size(t)) for t in changelogs)
        got, secs = asyncio.run(raw_consume_rate(changelogs, records))
        print(
            f"[bench] bare aiokafka consumer, the same changelogs: {got:,} records in {secs:.1f}s = {got / secs:,.0f}/s",
            flush=True,
        )
        warm = worker.start().wait_ready()
        worker.stop()
        print(f"[bench] restart with data dir kept (warm): ready in {warm:.1f}s", flush=True)
        shutil.rmtree(worker.data_dir)
        cold = worker.start().wait_ready()
        restored, restore_s = restore_figures(worker.url)
        found, asked = asyncio.run(read_accounts(worker.url, stored))
        worker.stop()
        rate = restored / restore_s if restore_s > 0 else float("nan")
        print(
            f"[bench] restart with data dir deleted (cold): ready in {cold:.1f}s; restored {restored:,.0f} changelog records "
            f"in {restore_s:.1f}s = {rate:,.0f}/s ({rate / (got / secs):.2f}x the bare consumer); "
            f"{found:,} of {asked:,} accounts asked for found",
            flush=True,
        )
        print(f"[bench] the bulk restore itself: {last_bulk_restore(Path(tmp) / 'validator.log')}", flush=True)
        note = f"{stored:,} accounts"
        results.record(f"validator.warm_restart@{stored}", warm, "s", note=note)
        results.record(f"validator.cold_restart@{stored}", cold, "s", note=f"{note}, restore included")
        if restore_s > 0:
            results.record(f"validator.restore@{stored}", rate, "records/s", baseline=got / secs, note=note)


#: Accounts read back after the cold restart, spread evenly over all of them.
READ_BACK = 2000


async def read_accounts(url: str, n: int) -> tuple[int, int]:
    """(found, asked): how many of :data:`READ_BACK` accounts of the ``n``, spread evenly,
    ``GET /aggregates/{id}`` finds (16 requests at a time)."""
    found = 0
    asked = sorted({k * n // READ_BACK for k in range(READ_BACK)})
    ids = iter(asked)
    async with aiohttp.ClientSession() as http:

        async def reader() -> None:
            nonlocal found
            for i in ids:
                async with http.get(f"{url}/aggregates/acct-{i}") as resp:
                    found += resp.status == 200

        await asyncio.gather(*(reader() for _ in range(16)))
    return found, len(asked)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench validator")
    parser.add_argument("--commands", type=int, default=BACKLOG)
    parser.add_argument("--rates", default="500,2000,10000", help="comma-separated commands/s for the latency runs")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each latency run")
    parser.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for the worker, e.g. STATEFLEET_CONSUMER_FETCH_MAX_WAIT_MS=10 (repeatable)",
    )
    parser.add_argument("--port", type=int, default=18001)
    parser.add_argument(
        "--batch-rounds", type=int, default=5, help="rounds of one 1,000-command batch against 1,000 single commands (0: none)"
    )
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--stored", type=int, default=0, help="measure a cold restart with this many accounts instead (0: not)")
    args, _ = parser.parse_known_args(argv)
    rates = [int(r) for r in args.rates.split(",") if r.strip()]
    extra_env = {name: value for name, _, value in (item.partition("=") for item in args.worker_env)}
    if args.stored:
        cold_restart(args.stored, args.port, extra_env)
        return

    prefix = f"bench{uuid.uuid4().hex[:8]}."
    settings = Settings(kafka_bootstrap_servers=bootstrap(), topic_prefix=prefix)
    commands_topic, events_topic = f"{prefix}account-commands", f"{prefix}account-events"
    raw_topic, raw_echo = f"{prefix}raw-baseline", f"{prefix}raw-echo"
    print(f"[bench] machine: {machine()}; prefix {prefix}", flush=True)
    asyncio.run(
        ensure_topics_async(
            settings, [TopicSpec(commands_topic, 8), TopicSpec(events_topic, 8), TopicSpec(raw_topic, 8), TopicSpec(raw_echo, 8)]
        )
    )

    # -- baseline: bare aiokafka produce + consume of the same volume -------------------------------
    n = args.commands
    t0 = time.perf_counter()
    asyncio.run(produce_bulk(raw_topic, backlog(n)))
    produce_secs = time.perf_counter() - t0
    got, consume_secs = asyncio.run(raw_consume_rate([raw_topic], n))
    print(
        f"[bench] baseline: bare aiokafka produced {n:,} in {produce_secs:.2f}s ({n / produce_secs:,.0f}/s) "
        f"and consumed {got:,} in {consume_secs:.2f}s ({got / consume_secs:,.0f}/s)",
        flush=True,
    )

    asyncio.run(produce_bulk(commands_topic, backlog(n)))
    print(f"[bench] pre-loaded {n:,} commands", flush=True)

    with service_worker("validator", prefix, args.port, extra_env) as url:
        caught_up = CaughtUp(url, n)
        caught_up.start()
        wait_decided(url, n, report=True)
        events = asyncio.run(read_events(events_topic, n))
        stamps = [ts for ts, _ in events]
        span = (max(stamps) - min(stamps)) / 1000
        rate = len(events) / span if span > 0 else float("nan")
        versions: dict[str, list[int]] = {}
        for _, value in events:
            e = orjson.loads(value)
            versions.setdefault(e["account_id"], []).append(e["version"])
        exact = all(v == list(range(1, len(v) + 1)) for v in versions.values()) and len(events) == n
        print(
            f"[bench] validator worker: {len(events):,} events in {span:.2f}s = {rate:,.0f} commands/s "
            f"({rate / (got / consume_secs):.1%} of the bare consumer's rate); "
            f"events exact (versions 1..k per account, none missing): {exact}",
            flush=True,
        )
        # The figures of another backlog size are kept apart: a smaller backlog decides faster.
        sized = "" if n == BACKLOG else f"@{n}"
        if exact:
            results.record(f"validator.backlog{sized}", rate, "commands/s", baseline=got / consume_secs, note=f"{n:,} commands")

        last_decision = max(stamps) / 1000
        reached = caught_up.wait()
        print(
            "[bench] outcome and projection handlers caught up "
            f"{max(reached.values()) - last_decision:.2f}s after the last decision (the last event's broker "
            "timestamp; counters polled every 100 ms): "
            + ", ".join(f"{stream} {at - last_decision:+.2f}s" for stream, at in reached.items()),
            flush=True,
        )
        results.record(f"validator.caught_up{sized}", max(reached.values()) - last_decision, "s")
        decided = n
        for r in sorted(rates):
            make = latency_commands(f"lat{r}")
            lat, achieved = asyncio.run(
                paced_round_trip(
                    commands_topic, events_topic, r, args.seconds, make, lambda value: orjson.loads(value)["command_id"]
                )
            )
            print(f"[bench] {summary(f'validator @ {r:,}/s', lat, int(r * args.seconds), achieved)}", flush=True)
            decided += int(r * args.seconds)
            wait_decided(url, decided)  # let a backlog left by an overload drain first
            wait_idle(url, decided)
            raw_make = lambda i, r=r: (f"raw{r}-{i}", f"k{i}".encode(), f"raw{r}-{i}".encode())  # noqa: E731
            raw_lat, raw_achieved = asyncio.run(
                paced_round_trip(raw_echo, raw_echo, r, args.seconds, raw_make, lambda value: value.decode())
            )
            print(f"[bench] {summary(f'bare aiokafka @ {r:,}/s', raw_lat, int(r * args.seconds), raw_achieved)}", flush=True)
            if lat and raw_lat:
                back = f"{len(lat):,}/{int(r * args.seconds):,} back"
                for q, name in ((0.5, "p50"), (0.99, "p99")):
                    results.record(
                        f"validator.latency_{name}@{r}", percentile(lat, q), "ms", baseline=percentile(raw_lat, q), note=back
                    )
        if args.batch_rounds:
            asyncio.run(batch_against_singles(url, args.batch_size, args.batch_rounds))
