"""Archive: ``account-events`` to Parquet, partitioned by event date, idempotent across restarts.

Every record becomes one row with its Kafka coordinates (``topic``, ``partition``,
``offset``, ``kafka_timestamp``), its raw ``key``, ``value`` and ``headers``, and the
event's fields read from the JSON value (``event_id``, ``type``, ``account_id``,
``program_id``, ``version``, ``occurred_at``). ``event_date`` (the partition column) is
the UTC date of ``occurred_at``, or of the Kafka timestamp for a value that is not an
event.

Spark's file sink and the checkpoint make it exactly-once: a batch's files count only
once the batch is recorded in the sink's log (``<archive>/_spark_metadata``), and a
restarted job re-runs an unrecorded batch with the same offsets. Files a crashed attempt
left behind are not in the log. Read the archive with Spark (``spark.read.parquet(path)``),
which follows the log; a reader that lists the folder directly may also see such files.

    python -m spark_jobs.archive_events [--available-now] [--output DIR] [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming.query import StreamingQuery

from shared.settings import Settings
from shared.topics import topic_names
from spark_jobs import cli, kafka_io, progress
from spark_jobs.config import SparkSettings, load_spark_settings
from spark_jobs.session import job_session

log = logging.getLogger(__name__)

JOB = "archive-events"

EVENT_SCHEMA = T.StructType(
    [
        T.StructField("event_id", T.StringType()),
        T.StructField("type", T.StringType()),
        T.StructField("account_id", T.StringType()),
        T.StructField("program_id", T.StringType()),
        T.StructField("version", T.LongType()),
        T.StructField("occurred_at", T.LongType()),
    ]
)


@dataclass(frozen=True)
class ArchiveOptions:
    output: str
    checkpoint: str
    available_now: bool = False
    trigger_interval: str = "1 minute"
    max_offsets_per_trigger: int | None = None
    query_name: str = "archive_events"


def archive_rows(raw: DataFrame) -> DataFrame:
    """Kafka records (with headers) to archive rows."""
    event = F.from_json(F.col("value").cast("string"), EVENT_SCHEMA)
    with_event = raw.withColumn("e", event)
    event_date = F.coalesce(F.to_date(F.timestamp_millis("e.occurred_at")), F.to_date("timestamp"))
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
        "e.account_id",
        "e.program_id",
        "e.version",
        "e.occurred_at",
        event_date.alias("event_date"),
    )


def start(spark: SparkSession, settings: Settings, spark_settings: SparkSettings, options: ArchiveOptions) -> StreamingQuery:
    topic = topic_names(settings).account_events
    kafka_io.ensure(settings, [topic])
    raw = kafka_io.read_stream(
        spark, settings, spark_settings, topic, max_offsets_per_trigger=options.max_offsets_per_trigger, include_headers=True
    )
    writer = (
        archive_rows(raw)
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
    p.add_argument("--available-now", action="store_true", help="archive what the topic holds now, then stop")
    p.add_argument("--output", help="archive folder (default STATEFLEET_SPARK_ARCHIVE_DIR/<prefix>account-events)")
    p.add_argument("--checkpoint", help="checkpoint location (default STATEFLEET_SPARK_CHECKPOINT_DIR/<prefix>archive-events)")
    p.add_argument("--trigger-interval", default="1 minute", help="micro-batch interval when streaming")
    p.add_argument("--max-offsets-per-trigger", type=int, help="records per micro-batch")
    cli.add_spark_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    cli.setup_logging()
    settings = Settings()
    spark_settings = load_spark_settings()
    topics = topic_names(settings)
    options = ArchiveOptions(
        output=args.output or str((spark_settings.archive_dir / f"{topics.prefix}account-events").resolve()),
        checkpoint=args.checkpoint or str((spark_settings.checkpoint_dir / f"{topics.prefix}{JOB}").resolve()),
        available_now=args.available_now,
        trigger_interval=args.trigger_interval,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
    )
    log.info("archiving %s into %s (checkpoint %s)", topics.account_events, options.output, options.checkpoint)
    with job_session(JOB, spark_settings, master=args.master, conf=cli.spark_conf(args), streaming=True) as spark:
        run(spark, settings, spark_settings, options)


if __name__ == "__main__":
    main()
