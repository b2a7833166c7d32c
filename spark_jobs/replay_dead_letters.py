"""Replay parked messages: select from ``parking-lot`` and send them back for retrying.

Messages are selected by origin topic, error class and failure time
(:mod:`spark_jobs.replay_selection`) and sent to ``dead-letters`` with ``dlq.attempt``
reset to 1 (``--to dead-letters``, the default), or straight to their retry topic
(``--to retry``). ``--dry-run`` prints what would be sent and sends nothing.

Each message is replayed at most once per run id (``--run-id``; a new one is made and
printed when not given): a message parked twice (same ``dlq.id``) is sent once, and
the records a run has already sent carry its id in ``statefleet.replay.run``, so running
the same run id again (after a failure, say) sends only what is still missing. Kafka
writes are not retried by Spark in this job (``spark.task.maxFailures=1``): a failed
write fails the run, and the same run id finishes it.

    python -m spark_jobs.replay_dead_letters --error-class TimeoutError --since 2024-05-01 --dry-run
"""

from __future__ import annotations

import argparse
import logging
import secrets
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from shared.dead_letters import ID, parse_dead_letter
from shared.settings import Settings
from shared.topics import topic_names
from spark_jobs import cli, kafka_io
from spark_jobs.config import SparkSettings, load_spark_settings
from spark_jobs.replay_selection import RUN_HEADER, ReplayFilter, Target, origin_names, replay_for, source_of
from spark_jobs.session import job_session

log = logging.getLogger(__name__)

JOB = "replay-dead-letters"
SELECTED_SCHEMA = (
    "source string, parked_partition int, parked_offset long, dlq_id string, origin_topic string, "
    "error_class string, failed_at long, attempt long, target_topic string, key binary, value binary, "
    "header_keys array<string>, header_values array<binary>"
)
SELECTED_COLUMNS = [c.strip().split(" ")[0] for c in SELECTED_SCHEMA.split(",")]


class ReplayError(RuntimeError):
    """The replay cannot go ahead; the message says what to do."""


def select_messages(
    filters: ReplayFilter, target: Target, dead_letters_topic: str, default_retry_topic: str, run_id: str
) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """A ``mapInPandas`` function: parked records to the replays of those ``filters`` select."""

    def select(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            rows: list[tuple[Any, ...]] = []
            for topic, partition, offset, ts, key, value, hkeys, hvalues in zip(
                frame["topic"],
                frame["partition"],
                frame["offset"],
                frame["timestamp_ms"],
                frame["key"],
                frame["value"],
                frame["header_keys"],
                frame["header_values"],
                strict=True,
            ):
                headers = list(zip(list(hkeys), [bytes(v) for v in hvalues], strict=True))
                dl = parse_dead_letter(
                    key,
                    value,
                    headers,
                    topic=topic,
                    partition=int(partition),
                    offset=int(offset),
                    timestamp_ms=int(ts),
                    default_retry_topic=default_retry_topic,
                )
                if not filters.matches(dl):
                    continue
                replay = replay_for(dl, target, dead_letters_topic, run_id, source_of(topic, int(partition), int(offset)))
                rows.append(
                    (
                        replay.source,
                        int(partition),
                        int(offset),
                        dl.id,
                        dl.original_topic,
                        dl.error_class,
                        dl.failed_at,
                        dl.attempt,
                        replay.target_topic,
                        key,
                        value,
                        [k for k, _ in replay.headers],
                        [v for _, v in replay.headers],
                    )
                )
            yield pd.DataFrame(rows, columns=SELECTED_COLUMNS)

    return select


def _header(name: str) -> Any:
    return F.expr(f"element_at(filter(headers, h -> h.key = '{name}'), -1).value").cast("string")


@dataclass
class ReplayResult:
    run_id: str
    dry_run: bool
    selected: int
    already_replayed: int
    sent: int
    by_target: dict[str, int] = field(default_factory=dict)
    preview: list[dict[str, Any]] = field(default_factory=list)


def already_replayed(
    spark: SparkSession, settings: Settings, spark_settings: SparkSettings, topics: list[str], run_id: str
) -> DataFrame:
    """dlq.id of the messages this run id has already sent to ``topics``."""
    ranges = [
        r
        for r in kafka_io.offset_ranges(settings, topics, spark_settings.kafka_isolation_level).values()
        if r is not None and r.records > 0
    ]
    if not ranges:
        return spark.createDataFrame([], "dlq_id string")
    sent = kafka_io.read_batch(spark, settings, spark_settings, ranges)
    return sent.where(_header(RUN_HEADER) == run_id).select(_header(ID).alias("dlq_id")).distinct()


def run(
    spark: SparkSession,
    settings: Settings,
    spark_settings: SparkSettings,
    filters: ReplayFilter,
    target: Target,
    run_id: str,
    dry_run: bool,
    preview_rows: int = 50,
) -> ReplayResult:
    topics = topic_names(settings)
    parked_range = kafka_io.offset_ranges(settings, [topics.parking_lot], spark_settings.kafka_isolation_level)[
        topics.parking_lot
    ]
    if parked_range is None or parked_range.records == 0:
        log.warning(
            "%s %s: nothing to replay (check STATEFLEET_TOPIC_PREFIX if messages were parked)",
            topics.parking_lot,
            "does not exist" if parked_range is None else "is empty",
        )
        return ReplayResult(run_id, dry_run, 0, 0, 0)

    parked = kafka_io.read_batch(spark, settings, spark_settings, [parked_range]).select(
        "topic",
        "partition",
        "offset",
        F.unix_millis("timestamp").alias("timestamp_ms"),
        "key",
        "value",
        F.coalesce(F.expr("transform(headers, h -> h.key)"), F.array().cast("array<string>")).alias("header_keys"),
        F.coalesce(F.expr("transform(headers, h -> h.value)"), F.array().cast("array<binary>")).alias("header_values"),
    )
    selected = parked.mapInPandas(select_messages(filters, target, topics.dead_letters, topics.retry, run_id), SELECTED_SCHEMA)
    # A message parked twice (same dlq.id) is replayed once: the first parked copy.
    first = Window.partitionBy("dlq_id").orderBy("parked_partition", "parked_offset")
    selected = selected.withColumn("n", F.row_number().over(first)).where("n = 1").drop("n").persist()
    try:
        selected_count = selected.count()
        targets = sorted(r["target_topic"] for r in selected.select("target_topic").distinct().collect())
        done = already_replayed(spark, settings, spark_settings, targets, run_id)
        todo = selected.join(done, "dlq_id", "left_anti").persist()
        todo_count = todo.count()
        by_target = {r["target_topic"]: int(r["count"]) for r in todo.groupBy("target_topic").count().collect()}
        preview = [
            r.asDict()
            for r in todo.select("source", "dlq_id", "origin_topic", "error_class", "failed_at", "attempt", "target_topic")
            .orderBy("parked_partition", "parked_offset")
            .limit(preview_rows)
            .collect()
        ]
        result = ReplayResult(run_id, dry_run, selected_count, selected_count - todo_count, 0, by_target, preview)
        if not dry_run and todo_count:
            if target == "dead-letters":
                kafka_io.ensure(settings, [topics.dead_letters])
            missing = sorted(set(by_target) - kafka_io.existing_topics(settings, by_target))
            if missing:
                raise ReplayError(
                    f"target topics do not exist: {', '.join(missing)}; create them, or replay to dead-letters instead"
                )
            headers = F.expr(
                "transform(arrays_zip(header_keys, header_values), h -> named_struct('key', h.header_keys, "
                "'value', h.header_values))"
            )
            kafka_io.write_batch(
                todo.select(F.col("target_topic").alias("topic"), "key", "value", headers.alias("headers")), settings
            )
            result.sent = todo_count
        todo.unpersist()
    finally:
        selected.unpersist()
    return result


def report(result: ReplayResult, filters: ReplayFilter, target: Target) -> None:
    verb = "would send" if result.dry_run else "sent"
    print(f"replay run {result.run_id}: {filters.describe()}; target {target}", flush=True)
    print(
        f"  selected {result.selected}, already replayed in this run {result.already_replayed}, "
        f"{verb} {sum(result.by_target.values()) if result.dry_run else result.sent}",
        flush=True,
    )
    for topic, n in sorted(result.by_target.items()):
        print(f"  {verb} {n} to {topic}", flush=True)
    for row in result.preview:
        failed = datetime.fromtimestamp(row["failed_at"] / 1000, UTC).isoformat(timespec="seconds")
        print(
            f"  {row['source']} dlq.id={row['dlq_id']} origin={row['origin_topic']} error={row['error_class']} "
            f"failed_at={failed} attempt {row['attempt']}->1 -> {row['target_topic']}",
            flush=True,
        )
    shown = len(result.preview)
    remaining = sum(result.by_target.values()) - shown
    if remaining > 0:
        print(f"  ... and {remaining} more", flush=True)


def new_run_id() -> str:
    return f"replay-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(3)}"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spark_jobs.replay_dead_letters",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--origin-topic",
        action="append",
        default=[],
        metavar="TOPIC",
        help="only messages from this origin topic (dlq.original.topic; prefix optional); repeatable",
    )
    p.add_argument(
        "--error-class",
        action="append",
        default=[],
        metavar="CLASS",
        help="only messages that failed with this error class (dlq.error.class); repeatable",
    )
    p.add_argument(
        "--since",
        type=cli.time_arg,
        metavar="TIME",
        help="only messages whose last failure (dlq.failed.at) is at or after TIME (ISO-8601 or epoch ms)",
    )
    p.add_argument("--until", type=cli.time_arg, metavar="TIME", help="only messages that last failed before TIME")
    p.add_argument(
        "--to",
        choices=["dead-letters", "retry"],
        default="dead-letters",
        help="send to dead-letters (attempt reset; default) or straight to each message's retry topic",
    )
    p.add_argument("--run-id", help="replays of one run id happen at most once; default: a new id (printed)")
    p.add_argument("--dry-run", action="store_true", help="print what would be sent; send nothing")
    p.add_argument("--show", type=int, default=50, metavar="N", help="messages listed in the report (default 50)")
    cli.add_spark_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    cli.setup_logging()
    settings = Settings()
    spark_settings = load_spark_settings()
    if args.since is not None and args.until is not None and args.since >= args.until:
        sys.exit(cli.fail("--since must be before --until"))
    filters = ReplayFilter(
        origin_topics=origin_names(args.origin_topic, settings.topic_prefix),
        error_classes=frozenset(args.error_class),
        since_ms=args.since,
        until_ms=args.until,
    )
    run_id = args.run_id or new_run_id()
    conf = {"spark.task.maxFailures": "1", **cli.spark_conf(args)}
    try:
        with job_session(JOB, spark_settings, master=args.master, conf=conf) as spark:
            result = run(spark, settings, spark_settings, filters, args.to, run_id, args.dry_run, args.show)
    except ReplayError as exc:
        sys.exit(cli.fail(str(exc)))
    report(result, filters, args.to)


if __name__ == "__main__":
    main()
