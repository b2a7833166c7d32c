"""Activations: AccountCreated events joined with logins, written to ``activations``.

For each AccountCreated on ``account-events`` the job writes one record to ``activations``
(key account_id)::

    {"account_id", "program_id", "created_at", "first_login_at", "activated": true}

as soon as a login by that account with ``created_at <= ts <= created_at + window`` has
been seen, or, once the window has closed with no such login,
``{..., "first_login_at": null, "activated": false}``.

How it works (Structured Streaming):

* ``account-events`` records are read with ``shared.accounts.parse_event``, as every reader
  of the topic reads them: a record that breaks the contract's Event shape (the services
  dead-letter it) is skipped and reported, per micro-batch, in the progress log and in
  :attr:`RunResult.skipped_records`;
* both inputs get an event-time watermark (``occurred_at`` and the login's ``ts``, each
  with ``--watermark-delay``); the global watermark is the minimum of the two;
* a left outer stream-stream join on account_id with the time-range condition above: a
  matched pair comes out when both sides have arrived; the unmatched (not activated) row
  comes out once the watermark has passed ``created_at + window``. The same watermark
  lets Spark drop join state that can no longer match, so state stays bounded by
  roughly ``window + delay`` worth of accounts and logins;
* the join's rows of one micro-batch are first narrowed to the earliest login per account
  (:func:`earliest_logins`, over each partition of the join's output, which holds all of
  an account's rows), then ``dropDuplicates(account_id, created_at)`` keeps one record per
  account across batches (an account logging in several times inside its window, or a
  replayed AccountCreated, still gives one record). Its state is dropped by the same
  watermark;
* state lives in the RocksDB state store with changelog checkpointing; the checkpoint
  (``--checkpoint``) makes a restarted job continue where it stopped, and
  :class:`~spark_jobs.kafka_sink.KafkaBatchSink` keeps a re-run micro-batch from writing
  its records twice.

Late data: a login or AccountCreated older than the watermark when it arrives is
dropped (counted in the progress log as late rows). An account whose AccountCreated is
dropped gets no record at all. ``first_login_at`` is the earliest matching login of the
micro-batch in which the job first saw one: when several logins of the account inside its
window arrive in the same micro-batch, it is the earliest of them, so the same
micro-batch always gives the same record. (A matching login that arrives in a later
micro-batch, though earlier than the one written, changes nothing: the record is out.)

    python -m spark_jobs.activation_join [--available-now] [--window 3d] [--watermark-delay 1h]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming.query import StreamingQuery

from shared import codecs
from shared.accounts import ACCOUNT_CREATED, InvalidEvent, parse_event
from shared.settings import Settings
from shared.topics import TopicNames, topic_names
from spark_jobs import cli, kafka_io, progress, state_stats
from spark_jobs.checkpoint import has_state
from spark_jobs.config import SparkSettings, load_spark_settings
from spark_jobs.kafka_sink import KafkaBatchSink
from spark_jobs.session import job_session

log = logging.getLogger(__name__)

JOB = "activation-join"
DAY_MS = 86_400_000
#: The observation (``DataFrame.observe``) counting the account-events records skipped as malformed.
SKIPPED_EVENTS = "malformed_account_events"

CREATED_SCHEMA = "account_id string, program_id string, created_at long, error string"
LOGIN_SCHEMA = T.StructType(
    [T.StructField("account_id", T.StringType()), T.StructField("program_id", T.StringType()), T.StructField("ts", T.LongType())]
)


@dataclass(frozen=True)
class JoinOptions:
    checkpoint: str
    output_topic: str
    window_ms: int = 3 * DAY_MS
    watermark_delay_ms: int = 3_600_000
    available_now: bool = False
    trigger_interval: str = "10 seconds"
    max_offsets_per_trigger: int | None = None
    watermarks: bool = True
    query_name: str = "activation_join"


def read_created(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """A ``mapInPandas`` function: ``account-events`` values to AccountCreated rows (account_id,
    program_id, created_at), each read with ``parse_event``; a record that breaks the Event
    shape becomes a row with only ``error`` set, events of other types no row."""
    for frame in frames:
        cols: dict[str, list[object]] = {"account_id": [], "program_id": [], "created_at": [], "error": []}
        for value in frame["value"]:
            try:
                change = parse_event(codecs.loads_object(value))
            except (codecs.DecodeError, InvalidEvent) as exc:
                row: tuple[object, ...] = (None, None, None, str(exc))
            else:
                if change.type != ACCOUNT_CREATED:
                    continue
                row = (change.account_id, change.program_id, change.occurred_at, None)
            for name, v in zip(cols, row, strict=True):
                cols[name].append(v)
        yield pd.DataFrame(
            {
                "account_id": pd.Series(cols["account_id"], dtype=object),
                "program_id": pd.Series(cols["program_id"], dtype=object),
                "created_at": pd.array(cols["created_at"], dtype="Int64"),
                "error": pd.Series(cols["error"], dtype=object),
            }
        )


def created_events(raw: DataFrame) -> DataFrame:
    """AccountCreated rows (account_id, program_id, created_at ms, created_ts) from ``account-events``
    records; the malformed ones are skipped and counted (observation :data:`SKIPPED_EVENTS`)."""
    parsed = progress.observe_skipped(
        raw.select("value").mapInPandas(read_created, CREATED_SCHEMA), SKIPPED_EVENTS, F.col("error")
    )
    return parsed.where(F.col("error").isNull()).select(
        "account_id", "program_id", "created_at", F.timestamp_millis("created_at").alias("created_ts")
    )


def login_events(raw: DataFrame) -> DataFrame:
    """Login rows (login_account_id, login_at ms, login_ts) from ``logins`` records."""
    parsed = raw.select(F.from_json(F.col("value").cast("string"), LOGIN_SCHEMA).alias("l")).select("l.*")
    return parsed.where(F.col("account_id").isNotNull() & F.col("ts").isNotNull()).select(
        F.col("account_id").alias("login_account_id"), F.col("ts").alias("login_at"), F.timestamp_millis("ts").alias("login_ts")
    )


def activations(
    created: DataFrame, logins: DataFrame, window_ms: int, watermark_delay_ms: int, watermarks: bool = True
) -> DataFrame:
    """The join; one row per account: account_id, program_id, created_at, first_login_at, activated.

    ``watermarks=False`` is only for comparing state growth: without watermarks Spark
    allows no outer join, so it is an inner join (activated accounts only) whose state
    is never dropped.
    """
    condition = (
        (F.col("account_id") == F.col("login_account_id"))
        & (F.col("login_ts") >= F.col("created_ts"))
        & (F.col("login_ts") <= F.col("created_ts") + F.expr(f"INTERVAL {window_ms} MILLISECONDS"))
    )
    if watermarks:
        delay = f"{watermark_delay_ms} milliseconds"
        joined = (
            created.withWatermark("created_ts", delay)
            .join(logins.withWatermark("login_ts", delay), condition, "leftOuter")
            .select("account_id", "program_id", "created_at", "created_ts", "login_at")
        )
        # The same schema out as in: created_ts keeps its event-time metadata, which lets the
        # dedupe drop its state by the watermark.
        joined = joined.mapInPandas(earliest_logins, joined.schema).dropDuplicates(["account_id", "created_ts"])
    else:
        joined = created.join(logins, condition, "inner")
    return joined.select(
        "account_id",
        "program_id",
        "created_at",
        F.col("login_at").alias("first_login_at"),
        F.col("login_at").isNotNull().alias("activated"),
    )


def earliest_logins(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """A ``mapInPandas`` function over one partition of the join's output in a micro-batch:
    per (account_id, created_ts), only the row with the earliest ``login_at`` (an unmatched
    row, ``login_at`` null, only when there is no other). The join partitions by account_id,
    so a partition holds every row of its accounts."""
    parts = [frame for frame in frames if not frame.empty]
    if not parts:
        return
    rows = pd.concat(parts, ignore_index=True)
    rows = rows.sort_values(["account_id", "created_ts", "login_at"], na_position="last", kind="stable")
    yield rows.drop_duplicates(["account_id", "created_ts"], keep="first")


def to_records(rows: DataFrame) -> DataFrame:
    """Kafka records: key account_id, value the contract's Activation JSON (nulls written)."""
    value = F.to_json(
        F.struct("account_id", "program_id", "created_at", "first_login_at", "activated"), {"ignoreNullFields": "false"}
    )
    return rows.select(F.col("account_id").alias("key"), value.alias("value"))


def default_checkpoint(spark_settings: SparkSettings, topics: TopicNames) -> str:
    return str((spark_settings.checkpoint_dir / f"{topics.prefix}{JOB}").resolve())


def start(spark: SparkSession, settings: Settings, spark_settings: SparkSettings, options: JoinOptions) -> StreamingQuery:
    """Start the streaming query; returns the StreamingQuery."""
    topics = topic_names(settings)
    kafka_io.ensure(settings, [topics.account_events, topics.logins, options.output_topic])
    created = created_events(
        kafka_io.read_stream(
            spark, settings, spark_settings, topics.account_events, max_offsets_per_trigger=options.max_offsets_per_trigger
        )
    )
    logins = login_events(
        kafka_io.read_stream(
            spark, settings, spark_settings, topics.logins, max_offsets_per_trigger=options.max_offsets_per_trigger
        )
    )
    out = to_records(activations(created, logins, options.window_ms, options.watermark_delay_ms, options.watermarks))
    sink = KafkaBatchSink(spark, settings, spark_settings, options.output_topic, options.checkpoint)
    writer = (
        out.writeStream.queryName(options.query_name)
        .option("checkpointLocation", options.checkpoint)
        .outputMode("append")
        .foreachBatch(sink)
    )
    writer = (
        writer.trigger(availableNow=True) if options.available_now else writer.trigger(processingTime=options.trigger_interval)
    )
    return writer.start()


@dataclass(frozen=True)
class RunResult:
    batches: list[progress.BatchProgress]
    input_rows: int
    seconds: float
    state: list[state_stats.OperatorState]

    @property
    def skipped_records(self) -> int:
        """``account-events`` records skipped as malformed (as the services dead-letter them)."""
        return sum(b.skipped_rows for b in self.batches)


def run(spark: SparkSession, settings: Settings, spark_settings: SparkSettings, options: JoinOptions) -> RunResult:
    """Run the query until it stops (``available_now``) or is interrupted; report what it did."""
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
    seconds = time.perf_counter() - started
    batches = progress.batches_of(query)
    state = state_stats.state_rows(spark, options.checkpoint) if has_state(spark, options.checkpoint) else []
    return RunResult(batches, sum(b.input_rows for b in batches), seconds, state)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spark_jobs.activation_join",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--available-now", action="store_true", help="process what the topics hold now, then stop (tests, backfills)")
    p.add_argument(
        "--window",
        type=cli.duration_arg,
        default=3 * DAY_MS,
        metavar="DURATION",
        help="a login up to this long after creation activates the account (default 3d)",
    )
    p.add_argument(
        "--watermark-delay",
        type=cli.duration_arg,
        default=3_600_000,
        metavar="DURATION",
        help="how late an event may arrive and still count (default 1h)",
    )
    p.add_argument("--checkpoint", help="checkpoint location (default STATEFLEET_SPARK_CHECKPOINT_DIR/<prefix>activation-join)")
    p.add_argument("--output-topic", help="default: the prefixed 'activations' topic")
    p.add_argument("--trigger-interval", default="10 seconds", help="micro-batch interval when streaming")
    p.add_argument("--max-offsets-per-trigger", type=int, help="records per topic and micro-batch")
    cli.add_spark_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    cli.setup_logging()
    settings = Settings()
    spark_settings = load_spark_settings()
    topics = topic_names(settings)
    if args.window <= 0:
        sys.exit(cli.fail("--window must be longer than 0"))
    options = JoinOptions(
        checkpoint=args.checkpoint or default_checkpoint(spark_settings, topics),
        output_topic=args.output_topic or topics.activations,
        window_ms=args.window,
        watermark_delay_ms=args.watermark_delay,
        available_now=args.available_now,
        trigger_interval=args.trigger_interval,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
    )
    log.info(
        "joining %s with %s into %s (window %d ms, watermark delay %d ms, checkpoint %s)",
        topics.account_events,
        topics.logins,
        options.output_topic,
        options.window_ms,
        options.watermark_delay_ms,
        options.checkpoint,
    )
    with job_session(JOB, spark_settings, master=args.master, conf=cli.spark_conf(args), streaming=True) as spark:
        result = run(spark, settings, spark_settings, options)
    log.info(
        "done: %d batches, %d input rows (%d malformed, skipped) in %.1fs; state rows now: %s",
        len(result.batches),
        result.input_rows,
        result.skipped_records,
        result.seconds,
        state_stats.describe(result.state),
    )


if __name__ == "__main__":
    main()
