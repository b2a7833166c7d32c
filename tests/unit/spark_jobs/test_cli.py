from __future__ import annotations

import argparse

import pytest

from spark_jobs import cli

pytestmark = pytest.mark.spark


@pytest.mark.parametrize(
    ("text", "ms"),
    [("3d", 259_200_000), ("72h", 259_200_000), ("90m", 5_400_000), ("30s", 30_000), ("500ms", 500), (" 2 h ", 7_200_000)],
)
def test_durations(text: str, ms: int) -> None:
    assert cli.parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["3", "3 days", "-1h", "1.5h", "h"])
def test_bad_durations_say_what_is_expected(text: str) -> None:
    with pytest.raises(cli.UsageError, match=r"e\.g\. 3d"):
        cli.parse_duration_ms(text)


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1704067200000", 1_704_067_200_000),
        ("2024-01-01", 1_704_067_200_000),
        ("2024-01-01T01:00:00Z", 1_704_070_800_000),
        ("2024-01-01T02:00:00+01:00", 1_704_070_800_000),
    ],
)
def test_times(text: str, ms: int) -> None:
    assert cli.parse_time_ms(text) == ms


def test_bad_time() -> None:
    with pytest.raises(cli.UsageError, match="ISO-8601"):
        cli.parse_time_ms("yesterday")


def test_spark_options_become_spark_settings() -> None:
    parser = argparse.ArgumentParser()
    cli.add_spark_arguments(parser)
    args = parser.parse_args(
        [
            "--master",
            "spark://h:7077",
            "--driver-memory",
            "2g",
            "--executor-memory",
            "4g",
            "--num-executors",
            "3",
            "--conf",
            "spark.sql.shuffle.partitions=16",
            "--conf",
            "a.b=c=d",
        ]
    )
    assert args.master == "spark://h:7077"
    assert cli.spark_conf(args) == {
        "spark.driver.memory": "2g",
        "spark.executor.memory": "4g",
        "spark.executor.instances": "3",
        "spark.sql.shuffle.partitions": "16",
        "a.b": "c=d",
    }


def test_conf_needs_key_and_value() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
        cli.conf_pair("spark.master")


@pytest.mark.parametrize(
    ("main", "argv", "message"),
    [
        (
            "spark_jobs.backfill_tallies",
            ["--projection", "examples.orders.nowhere:PROJECTION"],
            "cannot import projection module 'examples.orders.nowhere'",
        ),
        (
            "spark_jobs.backfill_tallies",
            ["--projection", "examples.orders.projection:ORDER_EVENTS"],
            "examples.orders.projection:ORDER_EVENTS is a str, not a shared.projection.Projection",
        ),
        (
            "spark_jobs.activation_join",
            ["--first-topic", "order-events"],
            "--output-topic is required when the join is not the accounts' activation join",
        ),
        ("spark_jobs.archive_events", ["--topic", "order-events", "--fields", "offset"], "'offset' is a column of the archive"),
    ],
)
def test_a_job_given_arguments_it_cannot_use_stops_before_spark_and_says_why(
    main: str, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    module = __import__(main, fromlist=["main"])
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
