"""The archive's arguments: any topic, the fields read into columns, the time that dates a row;
and the rows of another domain's events (Spark, no Kafka)."""

from __future__ import annotations

import json
from datetime import date, datetime
from pathlib import Path

import pytest

from shared.topics import TopicNames
from spark_jobs.archive_events import archive_rows, options_of, parser
from spark_jobs.config import SparkSettings

pytestmark = pytest.mark.spark

TOPICS = TopicNames("p.")
T0 = 1_704_067_200_000  # 2024-01-01


def options(tmp_path: Path, *argv: str):  # type: ignore[no-untyped-def]
    settings = SparkSettings(archive_dir=tmp_path / "archive", checkpoint_dir=tmp_path / "checkpoints")
    return options_of(parser().parse_args(list(argv)), settings, TOPICS)


def test_the_defaults_archive_account_events_where_they_always_did(tmp_path: Path) -> None:
    o = options(tmp_path)
    assert (o.topic, o.fields, o.time_field) == ("account-events", ("account_id", "program_id"), "occurred_at")
    assert o.output == str((tmp_path / "archive" / "p.account-events").resolve())
    assert o.checkpoint == str((tmp_path / "checkpoints" / "p.archive-events").resolve())


def test_any_topic_has_its_own_output_and_checkpoint(tmp_path: Path) -> None:
    o = options(tmp_path, "--topic", "order-events", "--fields", "aggregate_id")
    assert (o.topic, o.fields, o.time_field) == ("order-events", ("aggregate_id",), "occurred_at")
    assert o.output == str((tmp_path / "archive" / "p.order-events").resolve())
    assert o.checkpoint == str((tmp_path / "checkpoints" / "p.archive-order-events").resolve())
    logins = options(tmp_path, "--topic", "logins", "--fields", "account_id,program_id", "--time-field", "ts")
    assert (logins.fields, logins.time_field) == (("account_id", "program_id"), "ts")
    assert options(tmp_path, "--topic", "x", "--fields", "").fields == ()
    for bad, message in [("offset", "a column of the archive already"), ("data.customer_id", "not a top-level field")]:
        with pytest.raises(ValueError, match=message):
            options(tmp_path, "--topic", "order-events", "--fields", bad)
    with pytest.raises(ValueError, match="named twice"):
        options(tmp_path, "--fields", "type")


def test_rows_of_another_domain(spark) -> None:  # type: ignore[no-untyped-def]
    placed = {"event_id": "e1", "type": "OrderPlaced", "aggregate_id": "o1", "version": 1, "occurred_at": T0 + 86_400_000}
    records: list[tuple[object, ...]] = [
        ("p.order-events", 0, 0, datetime(2024, 3, 1, 12), b"o1", json.dumps(placed).encode(), []),
        ("p.order-events", 0, 1, datetime(2024, 3, 1, 12), b"x", b"not json", []),
    ]
    raw = spark.createDataFrame(
        records,
        "topic string, partition int, offset long, timestamp timestamp, key binary, value binary, "
        "headers array<struct<key: string, value: binary>>",
    )
    rows = archive_rows(raw, ("aggregate_id",), "occurred_at")
    assert rows.columns == [
        *("topic", "partition", "offset", "kafka_timestamp", "key", "value", "headers"),
        *("event_id", "type", "aggregate_id", "version", "occurred_at", "event_date"),
    ]
    got = [r.asDict() for r in rows.select("offset", "type", "aggregate_id", "version", "event_date").orderBy("offset").collect()]
    assert got == [
        {"offset": 0, "type": "OrderPlaced", "aggregate_id": "o1", "version": 1, "event_date": date(2024, 1, 2)},
        {"offset": 1, "type": None, "aggregate_id": None, "version": None, "event_date": date(2024, 3, 1)},
    ]
