"""Backfill: every program's tally rebuilt from the full history of ``account-events``
and ``logins``, with the tally service's own semantics.

1. The current start and end offsets of both topics are looked up; exactly those
   records are read (and the ranges are recorded in the output's ``_manifest.json``).
2. Each record is read as the service reads it (:mod:`spark_jobs.tally_input`);
   records the service would reject are counted and skipped.
3. Per program (``groupBy("program_id").applyInPandas``) the records become
   ``AccountChange``/``Login`` objects and ``services.tallies.domain.fold_program``
   computes the tally, so replays and duplicates count once, as in the service.
4. Tallies go to Parquet (``program_id, numberActive, numberInactive, lastLogin``),
   and with ``--publish-topic`` also to a topic as the service publishes them.

``--verify-against URL`` compares the result with the live service's ``GET /tallies``
and exits with status 1, listing the programs that differ. The service may have read
records newer than the backfill's end offsets; compare when input is quiet.

    python -m spark_jobs.backfill_tallies [--output DIR] [--publish-topic program-tallies] [--verify-against URL]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from services.tallies.domain import InvalidInput, Login, Tally, fold_program
from shared import codecs
from shared.accounts import AccountChange
from shared.settings import Settings
from shared.topics import topic_names
from spark_jobs import cli, kafka_io, tally_compare
from spark_jobs.config import SparkSettings, load_spark_settings
from spark_jobs.hadoop_fs import HadoopFs
from spark_jobs.session import job_session
from spark_jobs.tally_input import CHANGE, LOGIN, parse_input

log = logging.getLogger(__name__)

JOB = "backfill-tallies"
INVALID = "invalid"

PARSED_SCHEMA = "kind string, program_id string, account_id string, type string, version long, ts long, error string"
TALLY_SCHEMA = "program_id string, numberActive long, numberInactive long, lastLogin long, value string"
PARQUET_COLUMNS = ["program_id", "numberActive", "numberInactive", "lastLogin"]


def parse_records(kinds: dict[str, str]) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """A ``mapInPandas`` function: Kafka records (topic, value) to parsed inputs, one row each."""

    def parse(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            cols: dict[str, list[Any]] = {c: [] for c in ("kind", "program_id", "account_id", "type", "version", "ts", "error")}
            for topic, value in zip(frame["topic"], frame["value"], strict=True):
                kind = kinds[topic]
                try:
                    item = parse_input(kind, value)
                except (codecs.DecodeError, InvalidInput) as exc:
                    row: tuple[Any, ...] = (INVALID, None, None, None, None, None, f"{topic}: {exc}")
                else:
                    if isinstance(item, AccountChange):
                        row = (CHANGE, item.program_id, item.account_id, item.type, item.version, None, None)
                    else:
                        row = (LOGIN, item.program_id, item.account_id, None, None, item.ts, None)
                for name, v in zip(cols, row, strict=True):
                    cols[name].append(v)
            yield pd.DataFrame(
                {
                    "kind": pd.Series(cols["kind"], dtype=object),
                    "program_id": pd.Series(cols["program_id"], dtype=object),
                    "account_id": pd.Series(cols["account_id"], dtype=object),
                    "type": pd.Series(cols["type"], dtype=object),
                    "version": pd.array(cols["version"], dtype="Int64"),
                    "ts": pd.array(cols["ts"], dtype="Int64"),
                    "error": pd.Series(cols["error"], dtype=object),
                }
            )

    return parse


def fold_group(frame: pd.DataFrame) -> pd.DataFrame:
    """An ``applyInPandas`` function: one program's inputs to its tally (``fold_program``)."""
    program_id = str(frame["program_id"].iloc[0])
    changes = []
    logins = []
    for kind, account_id, event_type, version, ts in zip(
        frame["kind"], frame["account_id"], frame["type"], frame["version"], frame["ts"], strict=True
    ):
        if kind == CHANGE:
            changes.append(AccountChange(account_id=account_id, program_id=program_id, type=event_type, version=int(version)))
        else:
            logins.append(Login(account_id=account_id, program_id=program_id, ts=int(ts)))
    tally = fold_program(program_id, changes, logins)
    return pd.DataFrame(
        {
            "program_id": [tally.program_id],
            "numberActive": [tally.numberActive],
            "numberInactive": [tally.numberInactive],
            "lastLogin": pd.array([tally.lastLogin], dtype="Int64"),
            "value": [codecs.dumps(tally.to_json()).decode()],
        }
    )


def parsed_inputs(records: DataFrame, kinds: dict[str, str]) -> DataFrame:
    """Kafka records of the input topics, read as the service reads them (invalid ones marked)."""
    return records.select("topic", "value").mapInPandas(parse_records(kinds), PARSED_SCHEMA)


def tallies(parsed: DataFrame) -> DataFrame:
    """One row per program: its tally (``fold_program`` over all its valid inputs)."""
    return parsed.where(F.col("kind") != INVALID).groupBy("program_id").applyInPandas(fold_group, TALLY_SCHEMA)


@dataclass
class BackfillResult:
    output: str
    ranges: dict[str, kafka_io.TopicRange]
    programs: int
    input_records: int
    invalid_records: int
    seconds: float
    tallies: dict[str, Tally] = field(default_factory=dict)
    published_to: str | None = None

    @property
    def rows_per_second(self) -> float:
        return self.input_records / self.seconds if self.seconds else 0.0

    def manifest(self, started_at: str) -> dict[str, Any]:
        return {
            "job": JOB,
            "started_at": started_at,
            "inputs": kafka_io.ranges_json(self.ranges),
            "input_records": self.input_records,
            "invalid_records": self.invalid_records,
            "programs": self.programs,
            "seconds": round(self.seconds, 3),
            "rows_per_second": round(self.rows_per_second, 1),
            "published_to": self.published_to,
        }


def run(
    spark: SparkSession, settings: Settings, spark_settings: SparkSettings, output: str, publish_topic: str | None = None
) -> BackfillResult:
    topics = topic_names(settings)
    kinds = {topics.account_events: CHANGE, topics.logins: LOGIN}
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    started = time.perf_counter()

    found = kafka_io.offset_ranges(settings, kinds, spark_settings.kafka_isolation_level)
    ranges = {t: r for t, r in found.items() if r is not None}
    for topic in sorted(set(kinds) - set(ranges)):
        log.warning("topic %s does not exist: read as empty", topic)
    for r in ranges.values():
        log.info("reading %s offsets %s", r.topic, {p: (r.start[p], r.end[p]) for p in sorted(r.end)})

    nonempty = [r for r in ranges.values() if r.records > 0]
    if nonempty:
        records = kafka_io.read_batch(spark, settings, spark_settings, nonempty)
    else:
        records = spark.createDataFrame([], "topic string, value binary")
    parsed = parsed_inputs(records, kinds).persist()
    try:
        by_kind = {r["kind"]: int(r["count"]) for r in parsed.groupBy("kind").count().collect()}
        input_records = sum(by_kind.values())
        invalid_records = by_kind.get(INVALID, 0)
        if invalid_records:
            examples = [r["error"] for r in parsed.where(F.col("kind") == INVALID).limit(5).collect()]
            log.warning("%d records skipped as the service would reject them, e.g. %s", invalid_records, examples)
        result_df = tallies(parsed).persist()
        programs = result_df.count()
        result_df.select(*PARQUET_COLUMNS).orderBy("program_id").write.mode("overwrite").parquet(output)
        if publish_topic:
            kafka_io.ensure(settings, [publish_topic])
            kafka_io.write_batch(result_df.select(F.col("program_id").alias("key"), F.col("value")), settings, publish_topic)
        collected = {
            r["program_id"]: Tally(
                program_id=r["program_id"],
                numberActive=int(r["numberActive"]),
                numberInactive=int(r["numberInactive"]),
                lastLogin=int(r["lastLogin"]) if r["lastLogin"] is not None else None,
            )
            for r in result_df.select(*PARQUET_COLUMNS).toLocalIterator()
        }
        result_df.unpersist()
    finally:
        parsed.unpersist()

    result = BackfillResult(
        output=output,
        ranges=ranges,
        programs=programs,
        input_records=input_records,
        invalid_records=invalid_records,
        seconds=time.perf_counter() - started,
        tallies=collected,
        published_to=publish_topic,
    )
    HadoopFs(spark, output).write_text(json.dumps(result.manifest(started_at), indent=2) + "\n", "_manifest.json")
    log.info(
        "backfilled %d programs from %d records (%d skipped) in %.1fs (%.0f rows/s) into %s%s",
        programs,
        input_records,
        invalid_records,
        result.seconds,
        result.rows_per_second,
        output,
        f", published to {publish_topic}" if publish_topic else "",
    )
    return result


def verify(result: BackfillResult, url: str) -> list[tally_compare.Difference]:
    live = tally_compare.fetch_live_tallies(url)
    diffs = tally_compare.differences(result.tallies, live)
    if diffs:
        print(f"{len(diffs)} programs differ between the backfill and {url}:", flush=True)
        for d in diffs:
            print(f"  {d.describe()}", flush=True)
    else:
        print(f"backfill equals {url}: {len(live)} programs", flush=True)
    return diffs


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spark_jobs.backfill_tallies",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--output", help="Parquet output folder (replaced); default STATEFLEET_SPARK_BACKFILL_DIR/<prefix>tallies-<UTC time>"
    )
    p.add_argument(
        "--publish-topic",
        metavar="TOPIC",
        help="also write the tallies to this topic (the topic prefix is applied), e.g. program-tallies",
    )
    p.add_argument(
        "--verify-against",
        metavar="URL",
        help="compare with the live tallies service at URL; exit 1 listing programs that differ",
    )
    cli.add_spark_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    cli.setup_logging()
    settings = Settings()
    spark_settings = load_spark_settings()
    topics = topic_names(settings)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    output = args.output or str((spark_settings.backfill_dir / f"{topics.prefix}tallies-{stamp}").resolve())
    publish = topics.name(args.publish_topic) if args.publish_topic else None
    with job_session(JOB, spark_settings, master=args.master, conf=cli.spark_conf(args)) as spark:
        result = run(spark, settings, spark_settings, output, publish)
    print(f"tallies of {result.programs} programs written to {output}", flush=True)
    if args.verify_against:
        try:
            diffs = verify(result, args.verify_against)
        except tally_compare.LiveServiceError as exc:
            sys.exit(cli.fail(str(exc)))
        if diffs:
            sys.exit(1)


if __name__ == "__main__":
    main()
