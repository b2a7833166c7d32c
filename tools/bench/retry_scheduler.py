"""Retry scheduler benchmark: what a tick costs with many entries stored and few due, how
fast due messages are redelivered, and how late.

    python -m tools.bench retry_scheduler [--stored 1000000] [--due 1000] [--burst 20000]

1. Storage: the tick's RocksDB work in-process, on databases opened with the options the
   services use (rocksdict, one shared block cache and memtable budget): seek to the
   low-water key, read the due entries, decode them, delete each and write its done
   marker and expiry row. Twenty rounds, each adding ``--due`` due entries then ticking,
   with ``--due`` and with ``--stored`` entries stored; and the same ticks seeking from
   the first key instead, which must step over the tombstones of everything deleted before.
2. Service: one scheduler worker (defaults: tick 1 s, batch limit 5000) whose schedule
   is pre-loaded through its changelog topics (the records the service itself writes,
   restored by Faust at start-up). Then ``--due`` dead letters all due at the same
   instant: the handler time of the ticks that redeliver them, for ``--due`` and for
   ``--stored`` entries stored. Then a burst of ``--burst`` dead letters due at one
   instant: redelivery rate (first to last redelivery, from the records' timestamps)
   and lateness (record timestamp minus due time), next to a bare aiokafka producer
   sending the same records with the same acks.
3. Backlog: the worker is stopped, ``--backlog`` dead letters are produced, and the
   worker is started again on its data dir: the rate at which it reads and schedules
   them once ready.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import rocksdict
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from services.retry_scheduler.domain import percentile
from services.retry_scheduler.entries import Entry, classify, decode_entry, encode_entry
from services.retry_scheduler.scans import scan_due
from services.retry_scheduler.state import (
    COUNTS_KEY,
    DONE_REDELIVERED,
    due_key,
    due_prefix,
    encode_counts,
    encode_done,
    id_key,
    split_due_key,
)
from shared import dead_letters as dl
from shared.engine import SharedMemoryOptions, partition_for
from shared.engine.clients import TopicSpec, delete_topics_with_prefix, ensure_topics_async, refresh_metadata
from shared.settings import Settings
from tools import web
from tools.bench import results
from tools.bench.common import bootstrap, machine, peak_rss_mib, raw_consume_rate, restore_figures, stop_worker, topic_size

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 8
BASE_DELAY_MS = 5000
#: Dead letters from this origin topic wait this long (a policy override), so a burst due at
#: one instant can be read in full before it is due: failed_at = due - BURST_DELAY_MS.
BURST_ORIGIN = "bench-burst"
BURST_DELAY_MS = 600_000
ROUNDS = 20
FAR_FUTURE_MS = 10 * 24 * 3600 * 1000


def log(msg: str) -> None:
    print(f"[bench] {msg}", flush=True)


def sample_entry(dlq_id: str, due_at: int, retry_topic: str = "retry") -> Entry:
    """A typical stored entry: a small JSON value, every dlq.* header, one header of its own."""
    now = int(time.time() * 1000)
    letter = dl.DeadLetter(
        id=dlq_id,
        key=f"account-{dlq_id[-6:]}".encode(),
        value=b'{"account_id":"a-1","amount":120,"note":"x"}',
        original_topic="account-commands",
        original_partition=3,
        original_offset=123456,
        retry_topic=retry_topic,
        attempt=1,
        error_class="TimeoutError",
        error_message="downstream did not answer within 5s",
        first_failed_at=now,
        failed_at=now,
        other_headers=[("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-01")],
    )
    return Entry(
        id=dlq_id,
        key=letter.key,
        value=letter.value,
        headers=tuple(letter.headers()),
        retry_topic=retry_topic,
        attempt=1,
        origin_topic=letter.original_topic,
        origin_partition=3,
        origin_offset=123456,
        error_class=letter.error_class,
        error_message=letter.error_message,
        first_failed_at=now,
        failed_at=now,
        received_at=now,
        due_at=due_at,
        max_attempts=5,
    )


# -- 1. storage ------------------------------------------------------------------------------------


@dataclass
class Dbs:
    schedule: Any
    index: Any
    expiry: Any


def open_dbs(root: Path) -> Dbs:
    options = SharedMemoryOptions()
    return Dbs(*(options.open(root / f"{name}.db") for name in ("schedule", "index", "expiry")))


def fill(dbs: Dbs, n: int, due_at: int | None, label: str) -> None:
    template = encode_entry(sample_entry("x" * 12, 0))
    batch = rocksdict.WriteBatch(raw_mode=True)
    index = rocksdict.WriteBatch(raw_mode=True)
    for i in range(n):
        dlq_id = f"{label}-{i:09d}"
        due = due_at if due_at is not None else int(time.time() * 1000) + FAR_FUTURE_MS + i
        key = due_key(due, dlq_id)
        batch.put(key, template)
        index.put(id_key(dlq_id), key)
        if len(batch) >= 50_000:
            dbs.schedule.write(batch)
            dbs.index.write(index)
            batch = rocksdict.WriteBatch(raw_mode=True)
            index = rocksdict.WriteBatch(raw_mode=True)
    dbs.schedule.write(batch)
    dbs.index.write(index)


def storage_tick(dbs: Dbs, now: int, start: bytes) -> tuple[int, bytes]:
    """The tick's RocksDB work for one partition; returns (entries handled, next low-water key)."""
    scan = scan_due(dbs.schedule, now, 5000, start)
    for key, raw in scan.items:
        decode_entry(raw)
        _, dlq_id = split_due_key(key)
        expiry = due_key(now + 3_600_000, dlq_id)
        dbs.schedule.delete(key)
        dbs.index.put(id_key(dlq_id), encode_done(DONE_REDELIVERED, 1, expiry))
        dbs.expiry.put(expiry, b"1")
    return len(scan.items), max(start, due_prefix(now + 1))


def storage_bench(sizes: list[int], due: int) -> dict[tuple[int, str], list[float]]:
    tick_times: dict[tuple[int, str], list[float]] = {}
    for stored in sizes:
        for variant in ("low-water", "first key"):
            with tempfile.TemporaryDirectory() as root:
                dbs = open_dbs(Path(root))
                started = time.perf_counter()
                fill(dbs, stored - due, None, "future")
                dbs.schedule.flush()
                dbs.index.flush()
                filled = time.perf_counter() - started
                times: list[float] = []
                start = b""
                for r in range(ROUNDS):
                    now = int(time.time() * 1000)
                    fill(dbs, due, now - 1, f"due{r}")
                    t0 = time.perf_counter()
                    handled, low = storage_tick(dbs, now, start if variant == "low-water" else b"")
                    times.append(time.perf_counter() - t0)
                    start = low
                    assert handled == due, (handled, due)
                tick_times[(stored, variant)] = times
                log(
                    f"storage: {stored:>9,} stored, {due:,} due, seek from {variant:9}: tick median "
                    f"{statistics.median(times) * 1000:7.2f} ms, first {times[0] * 1000:7.2f} ms, "
                    f"last {times[-1] * 1000:7.2f} ms (filled in {filled:.1f}s)"
                )
                for db in (dbs.schedule, dbs.index, dbs.expiry):
                    db.close()
    return tick_times


# -- 2. service -----------------------------------------------------------------------------------


def changelog(prefix: str, table: str) -> str:
    return f"{prefix}statefleet-retry_scheduler-{table}-changelog"


async def prefill_changelogs(prefix: str, n: int) -> None:
    """Stored entries, written to the tables' changelogs as the service writes them: each entry's
    ``schedule`` and ``index`` rows, then each partition's ``!counts`` row."""
    if n <= 0:
        return
    settings = Settings(kafka_bootstrap_servers=bootstrap(), topic_prefix=prefix)
    await ensure_topics_async(
        settings, [TopicSpec(changelog(prefix, t), PARTITIONS, compacted=True) for t in ("schedule", "index", "expiry", "parked")]
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap(), max_batch_size=512 * 1024, acks=1)
    await producer.start()
    # Whole record batches per partition (create_batch, send_batch): a send per record costs
    # several times the CPU, which decides how long ten million take on a shared machine.
    open_batches: dict[tuple[str, int], Any] = {}
    pending: list[Any] = []

    async def put(topic: str, p: int, key: bytes, value: bytes) -> None:
        batch = open_batches.get((topic, p))
        if batch is None or batch.append(key=key, value=value, timestamp=None) is None:
            if batch is not None:
                pending.append(await producer.send_batch(batch, topic, partition=p))
            batch = open_batches[(topic, p)] = producer.create_batch()
            batch.append(key=key, value=value, timestamp=None)
        if len(pending) >= 64:
            for fut in pending:
                await fut
            pending.clear()

    try:
        template = encode_entry(sample_entry("x" * 12, 0, retry_topic=f"{prefix}retry"))
        base = int(time.time() * 1000) + FAR_FUTURE_MS
        per_partition = [0] * PARTITIONS
        schedule, index = changelog(prefix, "schedule"), changelog(prefix, "index")
        for i in range(n):
            dlq_id = f"stored-{i:09d}"
            p = partition_for(dlq_id, PARTITIONS)
            per_partition[p] += 1
            key = due_key(base + i, dlq_id)
            await put(schedule, p, key, template)
            await put(index, p, id_key(dlq_id), key)
            if (i + 1) % 250_000 == 0:
                log(f"  pre-loaded {i + 1:,} entries")
        counted_as = classify(template)
        for p, stored in enumerate(per_partition):
            await put(index, p, COUNTS_KEY, encode_counts(Counter({counted_as: stored}), Counter()))
        for (topic, p), batch in open_batches.items():
            pending.append(await producer.send_batch(batch, topic, partition=p))
        for fut in pending:
            await fut
    finally:
        await producer.stop()


def letters(
    prefix: str, label: str, n: int, failed_at: int, origin: str = "account-commands"
) -> Iterator[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    replaced = {dl.FAILED_AT: str(failed_at), dl.FIRST_FAILED_AT: str(failed_at), dl.ORIGINAL_TOPIC: origin}
    for i in range(n):
        dlq_id = f"{label}-{i:07d}"
        e = sample_entry(dlq_id, 0, retry_topic=f"{prefix}retry")
        headers = [(k, v) for k, v in e.headers if k not in replaced]
        headers += [(k, v.encode()) for k, v in replaced.items()]
        yield e.key or b"", e.value or b"", headers


async def produce_letters(topic: str, records: list[tuple[bytes, bytes, list[tuple[str, bytes]]]], acks: Any) -> float:
    """Send with one bare aiokafka producer; returns seconds until every record is acknowledged."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap(), linger_ms=5, max_batch_size=256 * 1024, acks=acks)
    await producer.start()
    try:
        started = time.perf_counter()
        futures = [await producer.send(topic, value, key=key, headers=headers) for key, value, headers in records]
        await producer.flush()
        for fut in futures:
            await fut
        return time.perf_counter() - started
    finally:
        await producer.stop()


async def read_timestamps(topic: str, label: str) -> list[int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap(), enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        await refresh_metadata(consumer)
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[int] = []
        marker = label.encode()
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            batch = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            for msgs in batch.values():
                out.extend(m.timestamp for m in msgs if dict(m.headers).get(dl.ID, b"").startswith(marker))
        return out
    finally:
        await consumer.stop()


@dataclass
class ServiceRun:
    stored: int
    ready_s: float
    tick_ms: float
    scan_ms: float
    ticks: int
    redelivered: int
    burst: int
    ingest_rate: float
    redelivery_rate: float
    lateness: tuple[int | None, int | None, int | None]
    raw_produce_rate: float
    backlog_rate: float | None = None
    #: Changelog records restored at start-up, over the restore's seconds (assignment to actives
    #: recovered), and the bare aiokafka consumer's rate over the same changelogs, same run.
    restore_rate: float | None = None
    raw_consume_rate: float | None = None


def scheduled_total(url: str) -> int:
    """``statefleet_retry_scheduled_total``: dead letters scheduled since the worker started (every origin topic's)."""
    total = 0.0
    for line in web.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(("statefleet_retry_scheduled_total ", "statefleet_retry_scheduled_total{")):
            total += float(line.rsplit(None, 1)[1])
    return int(total)


def wait_until(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    report = time.monotonic() + 30
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if time.monotonic() > report:
            report = time.monotonic() + 30
            log(f"  still waiting for {what}")
        time.sleep(0.2)
    raise TimeoutError(f"timed out waiting for {what}")


def stats(url: str) -> dict[str, Any]:
    out: dict[str, Any] = web.get(url + "/retries/stats", timeout=30).json()
    return out


def service_bench(stored: int, due: int, burst: int, port: int, backlog: int = 0, worker_logs: Path | None = None) -> ServiceRun:
    """One worker with ``stored`` entries; with ``worker_logs``, its log is kept there (INFO)."""
    prefix = f"bench{uuid.uuid4().hex[:8]}."
    dead, retry = f"{prefix}dead-letters", f"{prefix}retry"
    settings = Settings(kafka_bootstrap_servers=bootstrap(), topic_prefix=prefix)
    asyncio.run(ensure_topics_async(settings, [TopicSpec(t, PARTITIONS) for t in (dead, retry, f"{prefix}parking-lot")]))
    t0 = time.perf_counter()
    asyncio.run(prefill_changelogs(prefix, stored - due))
    log(f"service, {stored:,} stored: pre-loaded {stored - due:,} entries into the changelogs in {time.perf_counter() - t0:.1f}s")
    # The baseline of the restore: a bare aiokafka consumer reading the same changelogs, just before.
    raw_consume: float | None = None
    if stored > due:
        topics = [changelog(prefix, "schedule"), changelog(prefix, "index")]
        raw_records, raw_s = asyncio.run(raw_consume_rate(topics, 2 * (stored - due)))
        raw_consume = raw_records / raw_s
    with tempfile.TemporaryDirectory() as data_dir:
        env = {
            # The caller's PYTHONPATH after the repository's (e.g. a profiling hook).
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "STATEFLEET_TOPIC_PREFIX": prefix,
            "STATEFLEET_KAFKA_BOOTSTRAP_SERVERS": bootstrap(),
            "STATEFLEET_DATA_DIR": data_dir,
            "STATEFLEET_HTTP_PORT": str(port),
            "STATEFLEET_INSTANCE_ID": "bench",
            "STATEFLEET_LOG_LEVEL": "WARNING" if worker_logs is None else "INFO",
            "STATEFLEET_RETRY_BASE_DELAY_MS": str(BASE_DELAY_MS),
            "STATEFLEET_RETRY_JITTER": "none",
            "STATEFLEET_STANDBY_REPLICAS": "0",
            "STATEFLEET_BULK_RESTORE": "true",
            "STATEFLEET_RETRY_POLICY_OVERRIDES": orjson.dumps(
                {"origin_topic": {BURST_ORIGIN: {"base_delay_ms": BURST_DELAY_MS, "max_delay_ms": BURST_DELAY_MS}}}
            ).decode(),
        }
        log_path = (Path(data_dir) if worker_logs is None else worker_logs) / f"worker-{stored}.log"
        with open(log_path, "wb") as worker_log:

            def start_worker() -> subprocess.Popen[bytes]:
                return subprocess.Popen(
                    [sys.executable, "-m", "services.retry_scheduler"],
                    env=env,
                    cwd=REPO,
                    stdout=worker_log,
                    stderr=subprocess.STDOUT,
                )

            started = time.perf_counter()
            workers = [start_worker()]  # the last one is running
            url = f"http://127.0.0.1:{port}"
            try:

                def ready() -> bool:
                    if workers[-1].poll() is not None:
                        raise RuntimeError(f"worker exited: {log_path.read_text()[-3000:]}")
                    try:
                        return web.get(url + "/readyz", timeout=2).status_code == 200
                    except httpx.HTTPError:
                        return False

                wait_until(ready, 1800, "the worker to restore its tables")
                ready_s = time.perf_counter() - started
                assert stats(url)["scheduled"] == stored - due, stats(url)["scheduled"]
                restored, restore_s = restore_figures(url)
                restore_rate = restored / restore_s if restore_s > 0 else None
                log(f"service, {stored:,} stored: ready after {ready_s:.1f}s (restore included)")
                if restore_rate is not None and raw_consume is not None:
                    log(
                        f"service, {stored:,} stored: restored {restored:,.0f} changelog records in {restore_s:.1f}s = "
                        f"{restore_rate:,.0f}/s; bare aiokafka consumer, same changelogs: {raw_consume:,.0f}/s "
                        f"(ratio {restore_rate / raw_consume:.2f})"
                    )

                # -- one tick with `due` due among `stored` --------------------------------------
                failed_at = int(time.time() * 1000)  # due BASE_DELAY_MS from now, all at the same instant
                records = list(letters(prefix, "due", due, failed_at))
                asyncio.run(produce_letters(dead, records, acks="all"))
                wait_until(lambda: stats(url)["scheduled"] == stored, 60, "the due letters to be scheduled")
                due_at = failed_at + BASE_DELAY_MS
                wait_until(lambda: asyncio.run(topic_size(retry)) >= due, 120, "the due letters to be redelivered")
                time.sleep(1.5)
                busy = [t for t in stats(url)["busy_ticks"] if t["at"] >= due_at - 1]
                tick_ms = sum(t["ms"] for t in busy)
                scan_ms = sum(t["scan_ms"] for t in busy)
                redelivered = sum(t["redelivered"] for t in busy)
                log(
                    f"service, {stored:,} stored, {due:,} due: {len(busy)} partition ticks redelivered {redelivered:,} "
                    f"in {tick_ms:.1f} ms of handler time (scan {scan_ms:.2f} ms)"
                )

                # -- a burst: redelivery rate and lateness ---------------------------------------
                records = list(letters(prefix, "burst", burst, 0))
                raw_s = asyncio.run(produce_letters(f"{prefix}raw-baseline", records, acks="all"))
                lead_ms = 10_000 + 2 * burst  # time to read them all before they are due (at 500/s or more)
                failed_at = int(time.time() * 1000) + lead_ms - BURST_DELAY_MS
                records = list(letters(prefix, "burst", burst, failed_at, origin=BURST_ORIGIN))
                scheduled_before = scheduled_total(url)
                ingest_start = time.perf_counter()
                asyncio.run(produce_letters(dead, records, acks="all"))
                wait_until(lambda: scheduled_total(url) >= scheduled_before + burst, 900, "the burst to be scheduled")
                ingest_s = time.perf_counter() - ingest_start
                burst_due = failed_at + BURST_DELAY_MS
                if time.time() * 1000 > burst_due:
                    log("WARNING: the burst was not all scheduled before it was due; rate and lateness include ingest")
                wait_until(lambda: asyncio.run(topic_size(retry)) >= due + burst, 600, "the burst to be redelivered")
                stamps = sorted(asyncio.run(read_timestamps(retry, "burst")))
                span_s = max((stamps[-1] - stamps[0]) / 1000, 0.001)
                late = sorted(ts - burst_due for ts in stamps)
                run = ServiceRun(
                    stored=stored,
                    ready_s=ready_s,
                    tick_ms=tick_ms,
                    scan_ms=scan_ms,
                    ticks=len(busy),
                    redelivered=redelivered,
                    burst=burst,
                    ingest_rate=burst / ingest_s,
                    redelivery_rate=burst / span_s,
                    lateness=(percentile(late, 50), percentile(late, 99), late[-1] if late else None),
                    raw_produce_rate=burst / raw_s,
                    restore_rate=restore_rate,
                    raw_consume_rate=raw_consume,
                )
                log(
                    f"service, {stored:,} stored, burst of {burst:,}: read and scheduled at {run.ingest_rate:,.0f}/s; "
                    f"redelivered at {run.redelivery_rate:,.0f}/s ({span_s:.2f}s first to last); lateness p50 "
                    f"{run.lateness[0]} ms, p99 {run.lateness[1]} ms, max {run.lateness[2]} ms; bare aiokafka "
                    f"producer, same records, acks=all: {run.raw_produce_rate:,.0f}/s"
                )
                record_service_run(run, peak_rss_mib(workers[-1].pid))
                if backlog:
                    run.backlog_rate = backlog_bench(
                        prefix, backlog, url, workers, start_worker, ready, name=f"{stored:,} stored"
                    )
                    results.record(f"retry_scheduler.backlog_scheduled@{stored}", run.backlog_rate, "dead letters/s")
                return run
            finally:
                restarted = " (restarted, after the backlog)" if len(workers) > 1 else ""
                stop_worker(workers[-1], name=f"retry_scheduler worker{restarted}")
                asyncio.run(delete_topics_with_prefix(Settings(kafka_bootstrap_servers=bootstrap()), prefix))


def record_service_run(run: ServiceRun, peak_rss: float | None) -> None:
    """The figures of one service run, under ids that name how many entries were stored."""
    at = f"@{run.stored}"
    results.record(f"retry_scheduler.ready{at}", run.ready_s, "s", note="restore included")
    if run.restore_rate:  # with few entries stored, nothing may have been restored in bulk
        results.record(f"retry_scheduler.restore{at}", run.restore_rate, "records/s", baseline=run.raw_consume_rate)
    burst = f"burst of {run.burst:,}; baseline: a bare aiokafka producer, acks=all"
    results.record(f"retry_scheduler.burst_scheduled{at}", run.ingest_rate, "dead letters/s", run.raw_produce_rate, burst)
    results.record(f"retry_scheduler.burst_redelivered{at}", run.redelivery_rate, "records/s", run.raw_produce_rate, burst)
    p99 = run.lateness[1]
    results.record(f"retry_scheduler.burst_lateness_p99{at}", None if p99 is None else p99 / 1000, "s")
    results.record(f"retry_scheduler.peak_rss{at}", peak_rss, "MiB", note="after the burst")


def backlog_bench(
    prefix: str, backlog: int, url: str, workers: list[subprocess.Popen[bytes]], start_worker: Any, ready: Any, name: str
) -> float | None:
    """Dead letters waiting in the topic before the worker starts: stop the worker, produce
    ``backlog`` (due in BURST_DELAY_MS, so none is redelivered meanwhile), start it again on
    its data dir and time it from readiness until all are scheduled. Returns that rate."""
    stop_worker(workers[-1], name="retry_scheduler worker")
    failed_at = int(time.time() * 1000)
    records = list(letters(prefix, "backlog", backlog, failed_at, origin=BURST_ORIGIN))
    asyncio.run(produce_letters(f"{prefix}dead-letters", records, acks="all"))
    started = time.perf_counter()
    workers.append(start_worker())
    wait_until(ready, 1800, "the restarted worker to be ready")
    ready_at = time.perf_counter()
    before = scheduled_total(url)
    wait_until(lambda: scheduled_total(url) >= backlog, 900, "the backlog to be scheduled")
    done_at = time.perf_counter()
    rate = (backlog - before) / (done_at - ready_at) if backlog > before else None
    log(
        f"service, {name}, backlog of {backlog:,}: restarted and ready in {ready_at - started:.1f}s, "
        f"{before:,} scheduled by then; the rest read and scheduled at "
        f"{'n/a' if rate is None else f'{rate:,.0f}/s'} ({backlog / (done_at - started):,.0f}/s from the restart)"
    )
    return rate


#: What the baseline of the tick figures is: the same tick with only the due entries stored.
STORED_BASELINE = "baseline: the same with {:,} stored"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench retry_scheduler")
    parser.add_argument("--stored", type=int, default=1_000_000, help="Entries stored in the large case")
    parser.add_argument("--due", type=int, default=1000, help="Entries due in one tick")
    parser.add_argument("--burst", type=int, default=20_000, help="Dead letters due at one instant (rate, lateness)")
    parser.add_argument(
        "--backlog",
        type=int,
        # 20,000 were read in one to two seconds, too short a window to time by polling the
        # worker's counter every 0.2 s: the same code measured 10,000-33,000/s.
        default=100_000,
        help="Dead letters waiting before a restart of the worker (0: not measured)",
    )
    parser.add_argument("--port", type=int, default=18003)
    parser.add_argument("--skip-storage", action="store_true")
    parser.add_argument("--skip-service", action="store_true")
    parser.add_argument("--worker-logs", type=Path, default=None, help="keep the workers' logs (INFO) in this directory")
    args, _ = parser.parse_known_args(argv)
    log(f"machine: {machine()}")
    sizes = [args.due, args.stored]
    if not args.skip_storage:
        tick_times = storage_bench(sizes, args.due)
        small = statistics.median(tick_times[(args.due, "low-water")])
        large = statistics.median(tick_times[(args.stored, "low-water")])
        log(
            f"storage: tick with {args.stored:,} stored / with {args.due:,} stored = {large / small:.2f} "
            f"(median of {ROUNDS} ticks, seeking from the low-water key)"
        )
        results.record(
            f"retry_scheduler.storage_tick@{args.stored}",
            large * 1000,
            "ms",
            baseline=small * 1000,
            note=STORED_BASELINE.format(args.due),
        )
    if not args.skip_service:
        if args.worker_logs is not None:
            args.worker_logs.mkdir(parents=True, exist_ok=True)
        runs = [service_bench(n, args.due, args.burst, args.port, args.backlog, args.worker_logs) for n in sizes]
        log(
            f"service: tick handler time with {args.stored:,} stored / with {args.due:,} stored = "
            f"{runs[1].tick_ms / max(runs[0].tick_ms, 0.001):.2f}"
        )
        results.record(
            f"retry_scheduler.service_tick@{args.stored}",
            runs[1].tick_ms,
            "ms",
            baseline=runs[0].tick_ms,
            note=f"{args.due:,} due; " + STORED_BASELINE.format(args.due),
        )


if __name__ == "__main__":
    main(sys.argv[1:])
