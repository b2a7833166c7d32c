"""Spark job benchmarks: activation join throughput and state size over a long
synthetic run (with and without watermarks), and backfill rows/s.

    python -m tools.bench spark [--days 30] [--accounts-per-day 2000] [--backfill-accounts 20000]
    python -m tools.bench.spark ...   (the same, directly)

Method (the Spark figures of docs/benchmarks.md and docs/benchmarks-log.md come from this):

* Synthetic activity over ``--days`` simulated days: ``--accounts-per-day`` AccountCreated
  events per day at random times; 70% of accounts log in within 3 days, 10% after the
  window, 20% never; 20% log in a second time within the window. Both topics are
  produced in event-time order, as a live system would write them.
* State: the join runs ``--available-now`` with ``maxOffsetsPerTrigger`` set so that one
  micro-batch holds about ``1 / --batches-per-day`` of a day. After the run, Spark's state
  data source reader (``format("statestore")``) counts the state rows of every operator
  at sampled batches. The same input is then run through the join without watermarks
  (an inner join: Spark allows no outer join without them), whose state is never dropped.
* Throughput: the same input again from a fresh checkpoint with large micro-batches
  (``--throughput-batch`` records per topic); events/s = input rows / wall time of the
  query (from start until it stops, including the no-data batches that emit the not
  activated records).
* Backfill: ``--backfill-accounts`` account histories (1-5 events each, 20% delivered
  twice) and one login per account, over ``--backfill-programs`` programs; rows/s = input
  records / wall time of ``backfill_tallies.run`` (offset lookup, read, parse, fold per
  program, Parquet write).

Topics get a fresh ``bench-<id>.`` prefix and are deleted afterwards; checkpoints and
outputs go under ``.local/spark/bench`` and are removed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from shared.engine.clients import client_kwargs, delete_topics_with_prefix
from shared.settings import Settings
from shared.topics import topic_names
from spark_jobs import activation_join, backfill_tallies, cli, kafka_io
from spark_jobs.config import SparkSettings
from spark_jobs.session import build_session
from spark_jobs.state_stats import state_rows
from tools.bench import results
from tools.bench.common import machine

HOUR = 3_600_000
DAY = 24 * HOUR
T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z

Record = tuple[int, str, bytes]  # (event time, key, value)


def synthetic_activity(days: int, accounts_per_day: int, seed: int = 1) -> tuple[list[Record], list[Record]]:
    rng = random.Random(seed)
    created: list[Record] = []
    logins: list[Record] = []
    for day in range(days):
        for i in range(accounts_per_day):
            account, program = f"acct-{day}-{i}", f"prog-{i % 50}"
            at = T0 + day * DAY + rng.randrange(DAY)
            event = {
                "event_id": f"e-{account}",
                "command_id": f"c-{account}",
                "type": "AccountCreated",
                "account_id": account,
                "program_id": program,
                "version": 1,
                "occurred_at": at,
                "data": {},
            }
            created.append((at, account, json.dumps(event).encode()))
            roll = rng.random()
            times = []
            if roll < 0.7:
                times.append(at + rng.randrange(3 * DAY))
            elif roll < 0.8:
                times.append(at + 3 * DAY + HOUR + rng.randrange(3 * DAY))
            if rng.random() < 0.2:
                times.append(at + rng.randrange(3 * DAY))
            for ts in times:
                logins.append((ts, account, json.dumps({"account_id": account, "program_id": program, "ts": ts}).encode()))
    created.sort()
    logins.sort()
    return created, logins


async def _produce(settings: Settings, topic: str, records: Sequence[tuple[str, bytes]]) -> None:
    producer = AIOKafkaProducer(linger_ms=20, max_batch_size=256 * 1024, **client_kwargs(settings))
    await producer.start()
    try:
        pending = []
        for key, value in records:
            pending.append(await producer.send(topic, value, key=key.encode()))
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def produce(settings: Settings, topic: str, records: Sequence[tuple[str, bytes]]) -> None:
    asyncio.run(_produce(settings, topic, records))


@dataclass(frozen=True)
class StatePoint:
    batch_id: int
    simulated_day: float
    rows: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.rows.values())


def state_curve(spark: Any, checkpoint: str, batches: list[Any], total_rows: int, days: int, samples: int) -> list[StatePoint]:
    """State rows (state data source reader) at about ``samples`` batches spread over the run."""
    data_batches = [b for b in batches if b.input_rows > 0]
    if not data_batches:
        return []
    step = max(1, len(data_batches) // samples)
    chosen = data_batches[step - 1 :: step]
    if data_batches[-1] not in chosen:
        chosen.append(data_batches[-1])
    seen = 0
    cumulative = {}
    for b in batches:
        seen += b.input_rows
        cumulative[b.batch_id] = seen
    points = []
    for b in chosen:
        rows: dict[str, int] = {}
        for op in state_rows(spark, checkpoint, batch_id=b.batch_id):
            for side, n in op.rows.items():
                rows[f"{op.operator_name}.{side}" if side != "rows" else op.operator_name] = n
        points.append(StatePoint(b.batch_id, days * cumulative[b.batch_id] / total_rows, rows))
    return points


def run_join(
    spark: Any, settings: Settings, spark_settings: SparkSettings, checkpoint: Path, output: str, per_batch: int, watermarks: bool
) -> activation_join.RunResult:
    options = activation_join.JoinOptions(
        checkpoint=str(checkpoint),
        output_topic=output,
        available_now=True,
        max_offsets_per_trigger=per_batch,
        watermarks=watermarks,
        query_name=f"bench_join_{'wm' if watermarks else 'nowm'}_{checkpoint.name}",
    )
    return activation_join.run(spark, settings, spark_settings, options)


def print_curve(title: str, points: list[StatePoint]) -> None:
    print(f"\n{title}")
    if not points:
        print("  (no batches)")
        return
    keys = sorted({k for p in points for k in p.rows})
    print("  batch  sim.day  " + "  ".join(f"{k:>24}" for k in keys) + "       total")
    for p in points:
        print(
            f"  {p.batch_id:5d}  {p.simulated_day:7.1f}  "
            + "  ".join(f"{p.rows.get(k, 0):24d}" for k in keys)
            + f"  {p.total:10d}"
        )


def bench_join(
    spark: Any, settings: Settings, spark_settings: SparkSettings, root: Path, args: argparse.Namespace
) -> dict[str, Any]:
    topics = topic_names(settings)
    created, logins = synthetic_activity(args.days, args.accounts_per_day, args.seed)
    kafka_io.ensure(settings, [topics.account_events, topics.logins, topics.activations])
    started = time.perf_counter()
    produce(settings, topics.account_events, [(k, v) for _, k, v in created])
    produce(settings, topics.logins, [(k, v) for _, k, v in logins])
    total = len(created) + len(logins)
    print(
        f"produced {len(created)} AccountCreated and {len(logins)} logins over {args.days} simulated days "
        f"in {time.perf_counter() - started:.1f}s",
        flush=True,
    )
    per_batch = max(1, args.accounts_per_day // args.batches_per_day)
    result: dict[str, Any] = {
        "events": total,
        "created": len(created),
        "logins": len(logins),
        "days": args.days,
        "records_per_topic_per_batch": per_batch,
    }

    with_wm = run_join(spark, settings, spark_settings, root / "ck-watermarks", topics.activations, per_batch, True)
    curve = state_curve(spark, str(root / "ck-watermarks"), with_wm.batches, total, args.days, args.samples)
    print_curve("state rows with watermarks (state data source reader)", curve)
    result["state_with_watermarks"] = [p.__dict__ for p in curve]
    result["small_batches_events_per_s"] = round(with_wm.input_rows / with_wm.seconds, 1)
    results.record("spark.join_small_batches", with_wm.input_rows / with_wm.seconds, "events/s", note=f"{args.days} days")
    if curve:
        results.record(
            "spark.join_state_rows",
            max(p.total for p in curve),
            "rows",
            note=f"most state rows at a sampled batch with watermarks, {total:,} events over {args.days} days",
        )
    result["small_batches_batches"] = len(with_wm.batches)

    if not args.skip_no_watermark:
        no_wm = run_join(
            spark, settings, spark_settings, root / "ck-no-watermarks", topics.name("activations-nowm"), per_batch, False
        )
        curve = state_curve(spark, str(root / "ck-no-watermarks"), no_wm.batches, total, args.days, args.samples)
        print_curve("state rows without watermarks (inner join; state never dropped)", curve)
        result["state_without_watermarks"] = [p.__dict__ for p in curve]

    if args.throughput_batch:
        fast = run_join(
            spark, settings, spark_settings, root / "ck-throughput", topics.name("activations-tp"), args.throughput_batch, True
        )
        rate = fast.input_rows / fast.seconds
        busy = sum(b.duration_ms for b in fast.batches) / 1000
        print(
            f"\njoin throughput: {fast.input_rows} events in {fast.seconds:.1f}s = {rate:,.0f} events/s "
            f"({len(fast.batches)} batches of up to {args.throughput_batch} records per topic; "
            f"{fast.input_rows / busy:,.0f} events/s of batch time)",
            flush=True,
        )
        result["throughput_events_per_s"] = round(rate, 1)
        results.record("spark.join", rate, "events/s", note=f"{fast.input_rows:,} events")
        result["throughput_seconds"] = round(fast.seconds, 2)
        result["throughput_batches"] = len(fast.batches)
    return result


def backfill_history(accounts: int, programs: int, seed: int) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]:
    rng = random.Random(seed)
    flow = ["AccountCreated", "AccountUpdated", "AccountDeactivated", "AccountReactivated", "AccountDeleted"]
    events: list[tuple[str, bytes]] = []
    logins: list[tuple[str, bytes]] = []
    for i in range(accounts):
        account, program = f"acct-{i}", f"prog-{i % programs}"
        history = [
            (
                account,
                json.dumps(
                    {
                        "event_id": f"{account}:{v}",
                        "command_id": f"c-{account}-{v}",
                        "type": t,
                        "account_id": account,
                        "program_id": program,
                        "version": v,
                        "occurred_at": T0 + v,
                        "data": {},
                    }
                ).encode(),
            )
            for v, t in enumerate(flow[: rng.randint(1, 5)], start=1)
        ]
        events += history + (history if rng.random() < 0.2 else [])
        logins.append(
            (account, json.dumps({"account_id": account, "program_id": program, "ts": T0 + rng.randrange(30 * DAY)}).encode())
        )
    return events, logins


def bench_backfill(
    spark: Any, settings: Settings, spark_settings: SparkSettings, root: Path, args: argparse.Namespace
) -> dict[str, Any]:
    topics = topic_names(settings)
    events, logins = backfill_history(args.backfill_accounts, args.backfill_programs, args.seed)
    kafka_io.ensure(settings, [topics.account_events, topics.logins])
    produce(settings, topics.account_events, events)
    produce(settings, topics.logins, logins)
    result = backfill_tallies.run(spark, settings, spark_settings, str(root / "backfill"))
    print(
        f"\nbackfill: {result.input_records} records, {result.programs} programs in {result.seconds:.1f}s "
        f"= {result.rows_per_second:,.0f} rows/s",
        flush=True,
    )
    results.record("spark.backfill", result.rows_per_second, "rows/s", note=f"{result.input_records:,} records")
    return {
        "records": result.input_records,
        "programs": result.programs,
        "seconds": round(result.seconds, 2),
        "rows_per_s": round(result.rows_per_second, 1),
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tools.bench spark",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--days", type=int, default=30, help="simulated days of activity (default 30)")
    p.add_argument("--accounts-per-day", type=int, default=2000, help="AccountCreated events per day (default 2000)")
    p.add_argument("--batches-per-day", type=int, default=2, help="micro-batches per simulated day (default 2)")
    p.add_argument("--samples", type=int, default=15, help="batches at which state is read (default 15)")
    p.add_argument(
        "--throughput-batch",
        type=int,
        default=50_000,
        help="records per topic per micro-batch in the throughput run; 0 to skip (default 50000)",
    )
    p.add_argument("--skip-no-watermark", action="store_true", help="skip the run without watermarks")
    p.add_argument("--backfill-accounts", type=int, default=50_000, help="accounts in the backfill run; 0 to skip")
    p.add_argument("--backfill-programs", type=int, default=500)
    p.add_argument("--partitions", type=int, default=4, help="partitions of the bench topics (default 4)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    p.add_argument("--master", help="Spark master (default STATEFLEET_SPARK_MASTER, local[2])")
    return p


def main(argv: list[str]) -> None:
    args, ignored = parser().parse_known_args(argv)
    cli.setup_logging("WARNING")
    if ignored:
        print(f"[bench] spark: ignoring arguments meant for other areas: {' '.join(ignored)}", flush=True)
    prefix = f"bench-{uuid.uuid4().hex[:8]}."
    settings = Settings(topic_prefix=prefix, topic_partitions=args.partitions)
    spark_settings = SparkSettings()
    root = (spark_settings.checkpoint_dir.parent / "bench" / prefix.rstrip(".")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    conf = {
        # every batch's progress and state version is kept, so state can be read at any batch
        "spark.sql.streaming.numRecentProgressUpdates": "100000",
        "spark.sql.streaming.minBatchesToRetain": "100000",
    }
    spark = build_session("bench", spark_settings, master=args.master, conf=conf, streaming=True)
    figures: dict[str, Any] = {
        "machine": machine(),
        "load_average_at_start": os.getloadavg(),
        "spark": spark.version,
        "master": spark.sparkContext.master,
        "shuffle_partitions": spark_settings.shuffle_partitions,
        "topic_partitions": args.partitions,
    }
    try:
        figures["join"] = bench_join(spark, settings, spark_settings, root, args)
        if args.backfill_accounts:
            backfill_settings = Settings(topic_prefix=prefix + "bf.", topic_partitions=args.partitions)
            figures["backfill"] = bench_backfill(spark, backfill_settings, spark_settings, root, args)
    finally:
        spark.stop()
        asyncio.run(delete_topics_with_prefix(settings, prefix))
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print("\n" + json.dumps(figures), flush=True)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
