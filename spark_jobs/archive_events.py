"""Archive: a topic's records (``account-events`` unless ``--topic`` names another) to
Parquet, partitioned by event date, idempotent across restarts.

Every record becomes one row with its Kafka coordinates (``topic``, ``partition``,
``offset``, ``kafka_timestamp``), its raw ``key``, ``value`` and ``headers``, and fields
read from the JSON value: the event envelope every domain's events share (``event_id``,
``type``, ``version``), the ``--fields`` (top-level strings; default ``account_id`` and
``program_id``, the accounts' ids; e.g. ``aggregate_id`` for the orders' ``order-events``)
and the ``--time-field`` (epoch ms; default ``occurred_at``). ``event_date`` (the partition
column) is the UTC date of the time field, or of the Kafka timestamp for a value without
one (not JSON, not an event).

Spark's file sink and the checkpoint make it exactly-once: a batch's files count only
once the batch is recorded in the sink's log (``<archive>/_spark_metadata``), and a
restarted job re-runs an unrecorded batch with the same offsets. Files a crashed attempt
left behind are not in the log. Read the archive with Spark (``spark.read.parquet(path)``),
which follows the log; a reader that lists the folder directly may also see such files.

    python -m spark_jobs.archive_events [--topic TOPIC] [--fields F1,F2] [--time-field FIELD]
        [--available-now] [--output DIR] [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming.query import StreamingQuery

from shared.settings import Settings
from shared.topics import ACCOUNT_EVENTS, TopicNames, topic_names
from spark_jobs import cli, kafka_io, progress
from spark_jobs.config import SparkSettings, load_spark_settings
from spark_jobs.session import job_session

log = logging.getLogger(__name__)

JOB = "archive-events"

#: The fields of the accounts' events archived by default (besides the envelope and the time).
ACCOUNT_FIELDS = ("account_id", "program_id")
TIME_FIELD = "occurred_at"


def event_schema(fields: tuple[str, ...] = ACCOUNT_FIELDS, time_field: str = TIME_FIELD) -> T.StructType:
    """The JSON fields read from each value: ``event_id``, ``type``, ``fields``…, ``version``, the time."""
    names = ["event_id", "type", *fields]
    return T.StructType(
        [T.StructField(n, T.StringType()) for n in names]
        + [T.StructField("version", T.LongType()), T.StructField(time_field, T.LongType())]
    )


def column_problem(fields: tuple[str, ...], time_field: str) -> str | None:
    """Why these fields cannot be archived together (None: they can)."""
    names = ["event_id", "type", *fields, "version", time_field]
    clash = {"topic", "partition", "offset", "kafka_timestamp", "key", "value", "headers", "event_date"}
    for name in names:
        if not name or not name.isidentifier():
            return f"{name!r} is not a top-level field name"
        if name in clash:
            return f"{name!r} is a column of the archive already"
    if len(set(names)) != len(names):
        return f"a field is named twice among {', '.join(names)}"
    return None


@dataclass(frozen=True)
class ArchiveOptions:
    output: str
    checkpoint: str
    #: The topic's name without the prefix.
    topic: str = ACCOUNT_EVENTS
    fields: tuple[str, ...] = ACCOUNT_FIELDS
    time_field: str = TIME_FIELD
    available_now: bool = False
    trigger_interval: str = "1 minute"
    max_offsets_per_trigger: int | None = None
    query_name: str = "archive_events"


def archive_rows(raw: DataFrame, fields: tuple[str, ...] = ACCOUNT_FIELDS, time_field: str = TIME_FIELD) -> DataFrame:
    """Kafka records (with headers) to archive rows."""
    event = F.from_json(F.col("value").cast("string"), event_schema(fields, time_field))
    with_event = raw.withColumn("e", event)
    event_date = F.coalesce(F.to_date(F.timestamp_millis(f"e.{time_field}")), F.to_date("timestamp"))
    return with_event.select(
        "topic",
        "partition",
        "offset",
        F.col("timestamp").alias("kafka_timestamp"),
        "key",
        "value",
        "headers",
        "e.event_id",
        "e.type",
        *(f"e.{name}" for name in fields),
        "e.version",
        f"e.{time_field}",
        event_date.alias("event_date"),
    )


def start(spark: SparkSession, settings: Settings, spark_settings: SparkSettings, options: ArchiveOptions) -> StreamingQuery:
    topic = topic_names(settings).name(options.topic)
    kafka_io.ensure(settings, [topic])
    raw = kafka_io.read_stream(
        spark, settings, spark_settings, topic, max_offsets_per_trigger=options.max_offsets_per_trigger, include_headers=True
    )
    writer = (
        archive_rows(raw, options.fields, options.time_field)
        .writeStream.queryName(options.query_name)
        .format("parquet")
        .option("path", options.output)
        .option("checkpointLocation", options.checkpoint)
        .partitionBy("event_date")
        .outputMode("append")
    )
    writer = (
        writer.trigger(availableNow=True) if options.available_now else writer.trigger(processingTime=options.trigger_interval)
    )
    return writer.start()


def run(spark: SparkSession, settings: Settings, spark_settings: SparkSettings, options: ArchiveOptions) -> int:
    """Run until done (``available_now``) or interrupted; returns the records archived by this run."""
    listener = progress.attach(spark, options.query_name)
    started = time.perf_counter()
    query = start(spark, settings, spark_settings, options)
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        log.info("stopping %s (the checkpoint keeps its place)", options.query_name)
        query.stop()
    finally:
        progress.detach(spark, listener)
    batches = progress.batches_of(query)
    rows = sum(b.input_rows for b in batches)
    log.info(
        "archived %d records in %d batches (%.1fs) into %s", rows, len(batches), time.perf_counter() - started, options.output
    )
    return rows


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spark_jobs.archive_events",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--topic", default=ACCOUNT_EVENTS, help=f"the topic to archive, without the prefix (default {ACCOUNT_EVENTS})")
    p.add_argument(
        "--fields",
        default=",".join(ACCOUNT_FIELDS),
        metavar="F1,F2",
        help=f"comma-separated top-level string fields to read into columns, '' for none (default {','.join(ACCOUNT_FIELDS)})",
    )
    p.add_argument(
        "--time-field",
        default=TIME_FIELD,
        metavar="FIELD",
        help=f"the field (epoch ms) whose UTC date partitions the archive (default {TIME_FIELD})",
    )
    p.add_argument("--available-now", action="store_true", help="archive what the topic holds now, then stop")
    p.add_argument("--output", help="archive folder (default STATEFLEET_SPARK_ARCHIVE_DIR/<prefix><topic>)")
    p.add_argument(
        "--checkpoint",
        help="checkpoint location (default STATEFLEET_SPARK_CHECKPOINT_DIR/<prefix>archive-events for account-events, "
        "<prefix>archive-<topic> for another topic)",
    )
    p.add_argument("--trigger-interval", default="1 minute", help="micro-batch interval when streaming")
    p.add_argument("--max-offsets-per-trigger", type=int, help="records per micro-batch")
    cli.add_spark_arguments(p)
    return p


def options_of(args: argparse.Namespace, spark_settings: SparkSettings, topics: TopicNames) -> ArchiveOptions:
    """The archive the arguments name; raises ``ValueError`` saying what is wrong."""
    fields = tuple(f.strip() for f in args.fields.split(",") if f.strip())
    problem = column_problem(fields, args.time_field)
    if problem is not None:
        raise ValueError(problem)
    if not args.topic:
        raise ValueError("--topic must name a topic")
    job = JOB if args.topic == ACCOUNT_EVENTS else f"archive-{args.topic}"
    return ArchiveOptions(
        output=args.output or str((spark_settings.archive_dir / topics.name(args.topic)).resolve()),
        checkpoint=args.checkpoint or str((spark_settings.checkpoint_dir / topics.name(job)).resolve()),
        topic=args.topic,
        fields=fields,
        time_field=args.time_field,
        available_now=args.available_now,
        trigger_interval=args.trigger_interval,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        query_name="archive_events" if args.topic == ACCOUNT_EVENTS else f"archive_{args.topic}".replace("-", "_"),
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    cli.setup_logging()
    settings = Settings()
    spark_settings = load_spark_settings()
    topics = topic_names(settings)
    try:
        options = options_of(args, spark_settings, topics)
    except ValueError as exc:
        sys.exit(cli.fail(str(exc)))
    log.info("archiving %s into %s (checkpoint %s)", topics.name(options.topic), options.output, options.checkpoint)
    with job_session(JOB, spark_settings, master=args.master, conf=cli.spark_conf(args), streaming=True) as spark:
        run(spark, settings, spark_settings, options)


if __name__ == "__main__":
    main()
