"""Backfill: every row of a tallies projection rebuilt from the full history of its input
topics, with the projection's own code, so it equals what the tallies service computes.

The projection is a :class:`shared.projection.Projection` (``--projection pkg.module:attr``;
default ``STATEFLEET_TALLIES_PROJECTION``, else the accounts tallies, one row per program
from ``account-events`` and ``logins``; e.g. ``examples.orders.projection:PROJECTION``, one
row per customer from ``order-events``).

1. The current start and end offsets of the projection's input topics are looked up;
   exactly those records are read (and the ranges are recorded in the output's
   ``_manifest.json``).
2. Each record is read as the service reads it, by the projection's reader for its topic
   (:mod:`spark_jobs.tally_input`): a change of one entity or a mark of one category.
   Records the service would reject are counted and skipped.
3. Per category (``groupBy(category).applyInPandas``) ``shared.projection.fold`` applies the
   changes with the projection's ``evolve`` and ``contribution`` as the service applies them
   (per entity in version order, so replays and duplicates count once) and keeps the largest
   mark; the projection's ``row`` makes the published row. There is no second copy of a
   domain's counting rules here.
4. Rows go to Parquet, one column per field of the projection's ``row_model`` (for the
   accounts: ``program_id, numberActive, numberInactive, lastLogin``), and with
   ``--publish-topic`` also to a topic as the service publishes them (key: the category).

``--verify-against URL`` compares the result with the live service's ``GET /tallies`` (the
service must run the same projection) and exits with status 1, listing the rows that
differ. The service may have read records newer than the backfill's end offsets; compare
when input is quiet.

    python -m spark_jobs.backfill_tallies [--projection pkg.module:attr] [--output DIR]
        [--publish-topic TOPIC] [--verify-against URL]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from services.tallies.domain import PROJECTION
from shared import codecs
from shared.projection import Change, InvalidInput, Projection, ProjectionError, fold, load_projection
from shared.settings import Settings
from shared.topics import topic_names
from spark_jobs import cli, kafka_io, tally_compare
from spark_jobs.config import SparkSettings, load_spark_settings
from spark_jobs.hadoop_fs import HadoopFs
from spark_jobs.session import job_session
from spark_jobs.tally_input import read_input

log = logging.getLogger(__name__)

JOB = "backfill-tallies"
CHANGE = "change"
MARK = "mark"
INVALID = "invalid"

#: A record read: a change (category, entity, event as JSON, version), a mark (category, mark) or
#: an invalid record (error).
PARSED_SCHEMA = "kind string, category string, entity string, event string, version long, mark long, error string"
#: A category's row: its key and the row's JSON (as the service publishes it).
TALLY_SCHEMA = "key string, value string"
#: The accounts' Parquet columns (the default projection's row).
PARQUET_COLUMNS = ["program_id", "numberActive", "numberInactive", "lastLogin"]

_SPARK_TYPES: dict[Any, T.DataType] = {str: T.StringType(), int: T.LongType(), float: T.DoubleType(), bool: T.BooleanType()}


def spark_type(annotation: Any) -> T.DataType:
    """The Spark type of a row field: str, int, float, bool, optional or not; anything else is
    kept as its JSON text."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return spark_type(args[0])
    return _SPARK_TYPES.get(annotation, T.StringType())


def row_schema(projection: Projection) -> T.StructType:
    """The Parquet schema of a projection's rows: the fields of its ``row_model``, in order."""
    return T.StructType(
        [T.StructField(name, spark_type(info.annotation)) for name, info in projection.row_model.model_fields.items()]
    )


def parse_records(projection: Projection, prefix: str = "") -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """A ``mapInPandas`` function: Kafka records (topic, value) of the projection's inputs to
    parsed inputs, one row each, read as the service reads them (:func:`read_input`)."""

    def parse(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            cols: dict[str, list[Any]] = {c: [] for c in ("kind", "category", "entity", "event", "version", "mark", "error")}
            for topic, value in zip(frame["topic"], frame["value"], strict=True):
                try:
                    item = read_input(projection, topic, value, prefix)
                except (codecs.DecodeError, InvalidInput) as exc:
                    row: tuple[Any, ...] = (INVALID, None, None, None, None, None, f"{topic}: {exc}")
                else:
                    if isinstance(item, Change):
                        event = codecs.dumps(item.event).decode()
                        row = (CHANGE, item.category, item.entity, event, item.version, None, None)
                    else:
                        row = (MARK, item.category, None, None, None, item.value, None)
                for name, v in zip(cols, row, strict=True):
                    cols[name].append(v)
            yield pd.DataFrame(
                {
                    "kind": pd.Series(cols["kind"], dtype=object),
                    "category": pd.Series(cols["category"], dtype=object),
                    "entity": pd.Series(cols["entity"], dtype=object),
                    "event": pd.Series(cols["event"], dtype=object),
                    "version": pd.array(cols["version"], dtype="Int64"),
                    "mark": pd.array(cols["mark"], dtype="Int64"),
                    "error": pd.Series(cols["error"], dtype=object),
                }
            )

    return parse


def fold_group(projection: Projection) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """An ``applyInPandas`` function: one category's inputs to its row, with the projection's own
    rules (:func:`shared.projection.fold`, then its ``row``), as the service computes it."""

    def fold_category(frame: pd.DataFrame) -> pd.DataFrame:
        category = str(frame["category"].iloc[0])
        changes = []
        marks = []
        for kind, entity, event, version, mark in zip(
            frame["kind"], frame["entity"], frame["event"], frame["version"], frame["mark"], strict=True
        ):
            if kind == CHANGE:
                changes.append(Change(entity, category, codecs.loads(event), int(version)))
            else:
                marks.append(int(mark))
        totals, mark_value = fold(projection, changes, marks)
        row = projection.row(category, totals, mark_value)
        return pd.DataFrame({"key": [category], "value": [codecs.dumps(row).decode()]})

    return fold_category


def parsed_inputs(records: DataFrame, projection: Projection = PROJECTION, prefix: str = "") -> DataFrame:
    """Kafka records of the input topics, read as the service reads them (invalid ones marked)."""
    return records.select("topic", "value").mapInPandas(parse_records(projection, prefix), PARSED_SCHEMA)


def tallies(parsed: DataFrame, projection: Projection = PROJECTION) -> DataFrame:
    """One row per category: ``_key`` (the category), ``_value`` (the row's JSON, as the service
    publishes it) and the row's fields as columns (:func:`row_schema`): the projection's row
    over all the category's valid inputs."""
    rows = parsed.where(F.col("kind") != INVALID).groupBy("category").applyInPandas(fold_group(projection), TALLY_SCHEMA)
    schema = row_schema(projection)
    # _key and _value cannot clash with a row field: pydantic models have no public fields named so.
    return rows.select(
        F.col("key").alias("_key"), F.col("value").alias("_value"), F.from_json("value", schema).alias("row")
    ).select("_key", "_value", *(F.col(f"row.`{f.name}`").alias(f.name) for f in schema))


@dataclass
class BackfillResult:
    output: str
    ranges: dict[str, kafka_io.TopicRange]
    programs: int
    input_records: int
    invalid_records: int
    seconds: float
    #: Each category's row, by its key (as ``GET /tallies`` answers it).
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    published_to: str | None = None
    projection: str = PROJECTION.name

    @property
    def rows_per_second(self) -> float:
        return self.input_records / self.seconds if self.seconds else 0.0

    def manifest(self, started_at: str) -> dict[str, Any]:
        return {
            "job": JOB,
            "projection": self.projection,
            "started_at": started_at,
            "inputs": kafka_io.ranges_json(self.ranges),
            "input_records": self.input_records,
            "invalid_records": self.invalid_records,
            # One row per category (a program, a customer…); named after the accounts' programs.
            "programs": self.programs,
            "seconds": round(self.seconds, 3),
            "rows_per_second": round(self.rows_per_second, 1),
            "published_to": self.published_to,
        }


def run(
    spark: SparkSession,
    settings: Settings,
    spark_settings: SparkSettings,
    output: str,
    publish_topic: str | None = None,
    projection: Projection = PROJECTION,
) -> BackfillResult:
    topics = topic_names(settings)
    inputs = [topics.name(i.topic) for i in projection.inputs]
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    started = time.perf_counter()

    found = kafka_io.offset_ranges(settings, inputs, spark_settings.kafka_isolation_level)
    ranges = {t: r for t, r in found.items() if r is not None}
    for topic in sorted(set(inputs) - set(ranges)):
        log.warning("topic %s does not exist: read as empty", topic)
    for r in ranges.values():
        log.info("reading %s offsets %s", r.topic, {p: (r.start[p], r.end[p]) for p in sorted(r.end)})

    nonempty = [r for r in ranges.values() if r.records > 0]
    if nonempty:
        records = kafka_io.read_batch(spark, settings, spark_settings, nonempty)
    else:
        records = spark.createDataFrame([], "topic string, value binary")
    parsed = parsed_inputs(records, projection, topics.prefix).persist()
    try:
        by_kind = {r["kind"]: int(r["count"]) for r in parsed.groupBy("kind").count().collect()}
        input_records = sum(by_kind.values())
        invalid_records = by_kind.get(INVALID, 0)
        if invalid_records:
            examples = [r["error"] for r in parsed.where(F.col("kind") == INVALID).limit(5).collect()]
            log.warning("%d records skipped as the service would reject them, e.g. %s", invalid_records, examples)
        result_df = tallies(parsed, projection).persist()
        categories = result_df.count()
        columns = [f.name for f in row_schema(projection)]
        result_df.select(*columns).orderBy(columns[0]).write.mode("overwrite").parquet(output)
        if publish_topic:
            kafka_io.ensure(settings, [publish_topic])
            kafka_io.write_batch(
                result_df.select(F.col("_key").alias("key"), F.col("_value").alias("value")), settings, publish_topic
            )
        collected = {r["_key"]: json.loads(r["_value"]) for r in result_df.select("_key", "_value").toLocalIterator()}
        result_df.unpersist()
    finally:
        parsed.unpersist()

    result = BackfillResult(
        output=output,
        ranges=ranges,
        programs=categories,
        input_records=input_records,
        invalid_records=invalid_records,
        seconds=time.perf_counter() - started,
        rows=collected,
        published_to=publish_topic,
        projection=projection.name,
    )
    HadoopFs(spark, output).write_text(json.dumps(result.manifest(started_at), indent=2) + "\n", "_manifest.json")
    log.info(
        "backfilled %d rows of projection %s from %d records (%d skipped) in %.1fs (%.0f rows/s) into %s%s",
        categories,
        projection.name,
        input_records,
        invalid_records,
        result.seconds,
        result.rows_per_second,
        output,
        f", published to {publish_topic}" if publish_topic else "",
    )
    return result


def noun(projection: Projection) -> str:
    """What the rows are called in messages, after the key field: ``program_id`` → programs."""
    return f"{projection.key_field.removesuffix('_id')}s"


def verify(result: BackfillResult, url: str, projection: Projection = PROJECTION) -> list[tally_compare.Difference]:
    live = tally_compare.fetch_live_tallies(url, projection.key_field)
    diffs = tally_compare.differences(result.rows, live)
    if diffs:
        print(f"{len(diffs)} {noun(projection)} differ between the backfill and {url}:", flush=True)
        for d in diffs:
            print(f"  {d.describe()}", flush=True)
    else:
        print(f"backfill equals {url}: {len(live)} {noun(projection)}", flush=True)
    return diffs


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spark_jobs.backfill_tallies",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--projection",
        metavar="PKG.MODULE:ATTR",
        help="the projection to rebuild (shared.projection.Projection); default STATEFLEET_TALLIES_PROJECTION, "
        "else the accounts tallies (services.tallies.domain:PROJECTION)",
    )
    p.add_argument(
        "--output",
        help="Parquet output folder (replaced); default STATEFLEET_SPARK_BACKFILL_DIR/<prefix>tallies-<UTC time> "
        "(<prefix>tallies-<projection name>-<UTC time> for another projection than the accounts')",
    )
    p.add_argument(
        "--publish-topic",
        metavar="TOPIC",
        help="also write the rows to this topic (the topic prefix is applied), e.g. program-tallies",
    )
    p.add_argument(
        "--verify-against",
        metavar="URL",
        help="compare with the live tallies service at URL (running the same projection); exit 1 listing the rows that differ",
    )
    cli.add_spark_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    cli.setup_logging()
    settings = Settings()
    spark_settings = load_spark_settings()
    topics = topic_names(settings)
    spec = args.projection or settings.tallies_projection
    try:
        projection = load_projection(spec) if spec else PROJECTION
    except ProjectionError as exc:
        sys.exit(cli.fail(str(exc)))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    name = "tallies" if projection.name == PROJECTION.name else f"tallies-{projection.name}"
    output = args.output or str((spark_settings.backfill_dir / f"{topics.prefix}{name}-{stamp}").resolve())
    publish = topics.name(args.publish_topic) if args.publish_topic else None
    with job_session(JOB, spark_settings, master=args.master, conf=cli.spark_conf(args)) as spark:
        result = run(spark, settings, spark_settings, output, publish, projection)
    print(f"tallies of {result.programs} {noun(projection)} written to {output}", flush=True)
    if args.verify_against:
        try:
            diffs = verify(result, args.verify_against, projection)
        except tally_compare.LiveServiceError as exc:
            sys.exit(cli.fail(str(exc)))
        if diffs:
            sys.exit(1)


if __name__ == "__main__":
    main()
