"""The join "the first record of kind B within a window after a record of kind A, per key";
with its default arguments, the activation join (AccountCreated events joined with logins,
written to ``activations``).

What is joined is a :class:`~spark_jobs.join_spec.JoinSpec`: the two topics, the key and time
fields of each, the two kinds, the A fields carried into the output and the output's field
names, all command-line arguments (``--first-topic``, ``--first-kind``, ``--key``, ``--time``,
``--then-topic``, ``--then-kind``, ``--then-key``, ``--then-time``, ``--kind-field``,
``--carry``, ``--key-name``, ``--first-at-name``, ``--then-at-name``, ``--matched-name``).
For each A record the job writes one record keyed by its key::

    {<key-name>, <carried fields>..., <first-at-name>, <then-at-name>, <matched-name>}

as soon as a B record with the same key and ``A's time <= B's time <= A's time + window``
has been seen, or, once the window has closed with no such record, with ``<then-at-name>``
null and ``<matched-name>`` false. With the defaults (:data:`~spark_jobs.join_spec.ACCOUNTS`)
that is, for each AccountCreated on ``account-events``, the contract's Activation on
``activations`` (key account_id)::

    {"account_id", "program_id", "created_at", "first_login_at", "activated": true}

How it works (Structured Streaming):

* the records are read with :func:`spark_jobs.join_spec.read_record`: the ``account-events``
  records with ``shared.accounts.parse_event`` first, as every reader of the topic reads
  them. An A record that cannot be read (not JSON, broken contract, no key or time; the
  services dead-letter such an account event) is skipped and reported, per micro-batch, in
  the progress log and in :attr:`RunResult.skipped_records`; a B record that cannot be read
  is ignored;
* both inputs get an event-time watermark (A's and B's time, each with
  ``--watermark-delay``); the global watermark is the minimum of the two;
* a left outer stream-stream join on the key with the time-range condition above: a
  matched pair comes out when both sides have arrived; the unmatched row comes out once
  the watermark has passed A's time + window. The same watermark lets Spark drop join
  state that can no longer match, so state stays bounded by roughly ``window + delay``
  worth of records;
* the join's rows of one micro-batch are first narrowed to the earliest B per A record
  (:func:`earliest_logins`, over each partition of the join's output, which holds all of
  a key's rows), then ``dropDuplicates(key, A's time)`` keeps one record per A record
  across batches (several B records inside the window, or a replayed A record, still give
  one record). Its state is dropped by the same watermark;
* state lives in the RocksDB state store with changelog checkpointing; the checkpoint
  (``--checkpoint``) makes a restarted job continue where it stopped, and
  :class:`~spark_jobs.kafka_sink.KafkaBatchSink` keeps a re-run micro-batch from writing
  its records twice.

Late data: an A or B record older than the watermark when it arrives is dropped (counted
in the progress log as late rows). An A record that is dropped gets no output at all. The
B time written is the earliest matching B of the micro-batch in which the job first saw
one: when several arrive in the same micro-batch, it is the earliest of them, so the same
micro-batch always gives the same record. (A matching B that arrives in a later
micro-batch, though earlier than the one written, changes nothing: the record is out.)

    python -m spark_jobs.activation_join [--available-now] [--window 3d] [--watermark-delay 1h] [join arguments]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from shared import codecs
from shared.projection import InvalidInput
from shared.settings import Settings
from shared.topics import TopicNames, topic_names
from spark_jobs import cli, kafka_io, progress, state_stats
from spark_jobs.checkpoint import has_state
from spark_jobs.config import SparkSettings, load_spark_settings
from spark_jobs.join_spec import ACCOUNTS, JoinSpec, Side, read_record
from spark_jobs.kafka_sink import KafkaBatchSink
from spark_jobs.session import job_session

log = logging.getLogger(__name__)

JOB = "activation-join"
DAY_MS = 86_400_000
#: The observation (``DataFrame.observe``) counting the first topic's records skipped as malformed.
SKIPPED_EVENTS = "malformed_account_events"


def first_schema(spec: JoinSpec) -> str:
    carry = "".join(f"carry_{i} string, " for i in range(len(spec.carry)))
    return f"key string, {carry}first_at long, error string"


THEN_SCHEMA = "key string, then_at long, error string"


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
    spec: JoinSpec = ACCOUNTS


def read_side(
    side: Side, kind_field: str, carry: tuple[str, ...], time_column: str
) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """A ``mapInPandas`` function: a side's Kafka values to rows (key, carry_0…, ``time_column``,
    error), each read with :func:`~spark_jobs.join_spec.read_record`; a record that cannot be read
    becomes a row with only ``error`` set, a record of another kind no row."""
    names = ["key", *(f"carry_{i}" for i in range(len(carry))), time_column, "error"]

    def read(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            cols: list[list[object]] = [[] for _ in names]
            for value in frame["value"]:
                try:
                    read_value = read_record(side, value, kind_field, carry)
                except (codecs.DecodeError, InvalidInput) as exc:
                    row: tuple[object, ...] = (None, *(None for _ in carry), None, str(exc))
                else:
                    if read_value is None:
                        continue
                    key, carried, at = read_value
                    row = (key, *carried, at, None)
                for col, v in zip(cols, row, strict=True):
                    col.append(v)
            yield pd.DataFrame(
                {
                    name: pd.array(col, dtype="Int64") if name == time_column else pd.Series(col, dtype=object)
                    for name, col in zip(names, cols, strict=True)
                }
            )

    return read


def read_created(frames: Iterator[pd.DataFrame], spec: JoinSpec = ACCOUNTS) -> Iterator[pd.DataFrame]:
    """The first side's rows (key, carry_0…, first_at, error) from Kafka values (:func:`read_side`)."""
    return read_side(spec.first, spec.kind_field, spec.carry, "first_at")(frames)


def created_events(raw: DataFrame, spec: JoinSpec = ACCOUNTS) -> DataFrame:
    """Rows (key, carry_0…, first_at ms, first_ts) of the first side's kind; the records that
    cannot be read are skipped and counted (observation :data:`SKIPPED_EVENTS`)."""
    parsed = progress.observe_skipped(
        raw.select("value").mapInPandas(lambda frames: read_created(frames, spec), first_schema(spec)),
        SKIPPED_EVENTS,
        F.col("error"),
    )
    carry = [f"carry_{i}" for i in range(len(spec.carry))]
    return parsed.where(F.col("error").isNull()).select(
        "key", *carry, "first_at", F.timestamp_millis("first_at").alias("first_ts")
    )


def login_events(raw: DataFrame, spec: JoinSpec = ACCOUNTS) -> DataFrame:
    """Rows (then_key, then_at ms, then_ts) of the then side's kind; records without a usable key
    or time are ignored."""
    parsed = raw.select("value").mapInPandas(read_side(spec.then, spec.kind_field, (), "then_at"), THEN_SCHEMA)
    return parsed.where(F.col("error").isNull()).select(
        F.col("key").alias("then_key"), "then_at", F.timestamp_millis("then_at").alias("then_ts")
    )


def activations(
    created: DataFrame, logins: DataFrame, window_ms: int, watermark_delay_ms: int, watermarks: bool = True
) -> DataFrame:
    """The join; one row per first-side record: key, carry_0…, first_at, then_at, matched.

    ``watermarks=False`` is only for comparing state growth: without watermarks Spark
    allows no outer join, so it is an inner join (matched rows only) whose state is never
    dropped.
    """
    carry = [c for c in created.columns if c.startswith("carry_")]
    condition = (
        (F.col("key") == F.col("then_key"))
        & (F.col("then_ts") >= F.col("first_ts"))
        & (F.col("then_ts") <= F.col("first_ts") + F.expr(f"INTERVAL {window_ms} MILLISECONDS"))
    )
    if watermarks:
        delay = f"{watermark_delay_ms} milliseconds"
        joined = (
            created.withWatermark("first_ts", delay)
            .join(logins.withWatermark("then_ts", delay), condition, "leftOuter")
            .select("key", *carry, "first_at", "first_ts", "then_at")
        )
        # The same schema out as in: first_ts keeps its event-time metadata, which lets the
        # dedupe drop its state by the watermark.
        joined = joined.mapInPandas(earliest_logins, joined.schema).dropDuplicates(["key", "first_ts"])
    else:
        joined = created.join(logins, condition, "inner")
    return joined.select("key", *carry, "first_at", "then_at", F.col("then_at").isNotNull().alias("matched"))


def earliest_logins(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """A ``mapInPandas`` function over one partition of the join's output in a micro-batch:
    per (key, first_ts), only the row with the earliest ``then_at`` (an unmatched row,
    ``then_at`` null, only when there is no other). The join partitions by key, so a
    partition holds every row of its keys."""
    parts = [frame for frame in frames if not frame.empty]
    if not parts:
        return
    rows = pd.concat(parts, ignore_index=True)
    rows = rows.sort_values(["key", "first_ts", "then_at"], na_position="last", kind="stable")
    yield rows.drop_duplicates(["key", "first_ts"], keep="first")


def to_records(rows: DataFrame, spec: JoinSpec = ACCOUNTS) -> DataFrame:
    """Kafka records: key the join's key, value the output JSON (:attr:`JoinSpec.output_names`,
    nulls written); for :data:`ACCOUNTS`, the contract's Activation."""
    columns = ["key", *(f"carry_{i}" for i in range(len(spec.carry))), "first_at", "then_at", "matched"]
    fields = [F.col(c).alias(name) for c, name in zip(columns, spec.output_names, strict=True)]
    value = F.to_json(F.struct(*fields), {"ignoreNullFields": "false"})
    return rows.select(F.col("key"), value.alias("value"))


def default_checkpoint(spark_settings: SparkSettings, topics: TopicNames, spec: JoinSpec = ACCOUNTS) -> str:
    return str((spark_settings.checkpoint_dir / f"{topics.prefix}{spec.name}").resolve())


def start(spark: SparkSession, settings: Settings, spark_settings: SparkSettings, options: JoinOptions) -> StreamingQuery:
    """Start the streaming query; returns the StreamingQuery."""
    topics = topic_names(settings)
    spec = options.spec
    first_topic, then_topic = topics.name(spec.first.topic), topics.name(spec.then.topic)
    kafka_io.ensure(settings, list(dict.fromkeys([first_topic, then_topic, options.output_topic])))
    created = created_events(
        kafka_io.read_stream(
            spark, settings, spark_settings, first_topic, max_offsets_per_trigger=options.max_offsets_per_trigger
        ),
        spec,
    )
    logins = login_events(
        kafka_io.read_stream(
            spark, settings, spark_settings, then_topic, max_offsets_per_trigger=options.max_offsets_per_trigger
        ),
        spec,
    )
    out = to_records(activations(created, logins, options.window_ms, options.watermark_delay_ms, options.watermarks), spec)
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
        """Records of the first topic skipped as malformed (for ``account-events``: as the services dead-letter them)."""
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
        epilog=JOIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--available-now", action="store_true", help="process what the topics hold now, then stop (tests, backfills)")
    p.add_argument(
        "--window",
        type=cli.duration_arg,
        default=3 * DAY_MS,
        metavar="DURATION",
        help="a B record up to this long after the A record matches it (default 3d)",
    )
    p.add_argument(
        "--watermark-delay",
        type=cli.duration_arg,
        default=3_600_000,
        metavar="DURATION",
        help="how late an event may arrive and still count (default 1h)",
    )
    p.add_argument(
        "--checkpoint",
        help="checkpoint location (default STATEFLEET_SPARK_CHECKPOINT_DIR/<prefix>activation-join, "
        "or <prefix>join-<output topic> for other arguments than the accounts')",
    )
    p.add_argument(
        "--output-topic",
        help="full topic name (no prefix added); default: the prefixed 'activations' topic; required with "
        "other arguments than the accounts'",
    )
    p.add_argument("--trigger-interval", default="10 seconds", help="micro-batch interval when streaming")
    p.add_argument("--max-offsets-per-trigger", type=int, help="records per topic and micro-batch")
    join = p.add_argument_group(
        "what is joined (defaults: the activation join); topics without the prefix, fields as names or dotted paths"
    )
    first, then = ACCOUNTS.first, ACCOUNTS.then
    join.add_argument(
        "--first-topic", default=first.topic, metavar="TOPIC", help=f"topic of the A records (default {first.topic})"
    )
    join.add_argument(
        "--first-kind", default=first.kind, metavar="KIND", help=f"kind of the A records, '' for any (default {first.kind})"
    )
    join.add_argument("--key", default=first.key, metavar="FIELD", help=f"the key field of the A records (default {first.key})")
    join.add_argument(
        "--time", default=first.time, metavar="FIELD", help=f"the time field (epoch ms) of the A records (default {first.time})"
    )
    join.add_argument("--then-topic", default=then.topic, metavar="TOPIC", help=f"topic of the B records (default {then.topic})")
    join.add_argument("--then-kind", default="", metavar="KIND", help="kind of the B records, '' for any (default any)")
    join.add_argument("--then-key", metavar="FIELD", help="the key field of the B records (default: --key)")
    join.add_argument(
        "--then-time",
        default=then.time,
        metavar="FIELD",
        help=f"the time field (epoch ms) of the B records (default {then.time})",
    )
    join.add_argument(
        "--kind-field",
        default=ACCOUNTS.kind_field,
        metavar="FIELD",
        help=f"the field holding a record's kind (default {ACCOUNTS.kind_field})",
    )
    join.add_argument(
        "--carry",
        default=",".join(ACCOUNTS.carry),
        metavar="FIELDS",
        help=f"comma-separated fields of the A record copied into the output, '' for none (default {','.join(ACCOUNTS.carry)})",
    )
    join.add_argument(
        "--key-name", default=ACCOUNTS.key_name, metavar="NAME", help=f"output: the key (default {ACCOUNTS.key_name})"
    )
    join.add_argument(
        "--first-at-name",
        default=ACCOUNTS.first_at_name,
        metavar="NAME",
        help=f"output: A's time (default {ACCOUNTS.first_at_name})",
    )
    join.add_argument(
        "--then-at-name",
        default=ACCOUNTS.then_at_name,
        metavar="NAME",
        help=f"output: the first B's time, null when none (default {ACCOUNTS.then_at_name})",
    )
    join.add_argument(
        "--matched-name",
        default=ACCOUNTS.matched_name,
        metavar="NAME",
        help=f"output: whether a B came (default {ACCOUNTS.matched_name})",
    )
    cli.add_spark_arguments(p)
    return p


JOIN_EPILOG = """\
The accounts' activation join is the default; the same join on another domain, e.g. an order
shipped within 7 days of being placed:

  python -m spark_jobs.activation_join --first-topic order-events --first-kind OrderPlaced \\
      --key aggregate_id --then-topic order-events --then-kind OrderShipped --then-time occurred_at \\
      --carry data.customer_id --key-name order_id --first-at-name placed_at \\
      --then-at-name shipped_at --matched-name shipped --window 7d --output-topic order-shipments
"""


def spec_of(args: argparse.Namespace) -> JoinSpec:
    """The join the arguments name; :data:`ACCOUNTS` when they are the defaults. Raises
    ``ValueError`` saying what is wrong."""
    candidate = JoinSpec(
        first=Side(args.first_topic, args.key, args.time, args.first_kind or None),
        then=Side(args.then_topic, args.then_key or args.key, args.then_time, args.then_kind or None),
        kind_field=args.kind_field,
        carry=tuple(c.strip() for c in args.carry.split(",") if c.strip()),
        key_name=args.key_name,
        first_at_name=args.first_at_name,
        then_at_name=args.then_at_name,
        matched_name=args.matched_name,
        default_output=ACCOUNTS.default_output,
        name=ACCOUNTS.name,
    )
    if candidate == ACCOUNTS:
        return ACCOUNTS
    if not args.output_topic:
        raise ValueError("--output-topic is required when the join is not the accounts' activation join")
    return replace(candidate, default_output=None, name=f"join-{args.output_topic}")


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    cli.setup_logging()
    settings = Settings()
    spark_settings = load_spark_settings()
    topics = topic_names(settings)
    if args.window <= 0:
        sys.exit(cli.fail("--window must be longer than 0"))
    try:
        spec = spec_of(args)
    except ValueError as exc:
        sys.exit(cli.fail(str(exc)))
    options = JoinOptions(
        checkpoint=args.checkpoint or default_checkpoint(spark_settings, topics, spec),
        output_topic=args.output_topic or topics.name(spec.default_output or ""),
        window_ms=args.window,
        watermark_delay_ms=args.watermark_delay,
        available_now=args.available_now,
        trigger_interval=args.trigger_interval,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        spec=spec,
    )
    log.info(
        "joining %s (%s) with the first %s (%s) within %d ms per %s into %s (watermark delay %d ms, checkpoint %s)",
        topics.name(spec.first.topic),
        spec.first.kind or "any",
        topics.name(spec.then.topic),
        spec.then.kind or "any",
        options.window_ms,
        spec.first.key,
        options.output_topic,
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
