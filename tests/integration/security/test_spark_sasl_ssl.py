"""The activation join on the secure broker: Spark's Kafka connector over SASL_SSL, as the
job's own user with only its ACLs (tools/kafka_acls.py), reads both inputs and writes an
activation through its idempotent sink."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from shared.settings import Settings
from spark_jobs import activation_join as aj
from spark_jobs import kafka_io
from spark_jobs.session import build_session
from tests.integration.security.conftest import SecureBroker
from tests.integration.spark_jobs.conftest import small_spark_settings
from tests.support.kafka import produce

pytestmark = [pytest.mark.spark, pytest.mark.integration]

H = 3_600_000
T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    # One session per process: a session the Spark job tests started is theirs to stop.
    existing = SparkSession.getActiveSession()
    session = build_session(
        "tests-sasl", small_spark_settings(tmp_path_factory.mktemp("spark")), conf={"spark.default.parallelism": "2"}
    )
    yield session
    if existing is None:
        session.stop()


def job_settings(broker: SecureBroker, user: str) -> Settings:
    """The job's settings from the same variables a deployment sets."""
    env = {**broker.env(user), "STATEFLEET_TOPIC_PARTITIONS": "2"}
    fields: dict[str, Any] = {name.removeprefix("STATEFLEET_").lower(): value for name, value in env.items()}
    return Settings(**fields)


def test_the_activation_join_runs_over_sasl_ssl_as_its_own_user(
    secure_broker: SecureBroker, spark: object, tmp_path: Path
) -> None:
    b = secure_broker
    settings = job_settings(b, "activation_join")
    event = {
        "event_id": "e-1",
        "command_id": "c-1",
        "type": "AccountCreated",
        "account_id": "acct-1",
        "program_id": "prog-1",
        "version": 1,
        "occurred_at": T0,
        "data": {},
    }
    login = {"account_id": "acct-1", "program_id": "prog-1", "ts": T0 + H}
    # The job creates its topics as its own user, then the admin writes the inputs.
    options = aj.JoinOptions(checkpoint=str(tmp_path / "checkpoint"), output_topic=b.topic("activations"), available_now=True)
    kafka_io.ensure(settings, [b.topic("account-events"), b.topic("logins"), b.topic("activations")])
    produce(b.topic("account-events"), [("acct-1", json.dumps(event).encode())], connection=b.admin)
    produce(b.topic("logins"), [("acct-1", json.dumps(login).encode())], connection=b.admin)

    result = aj.run(spark, settings, small_spark_settings(tmp_path / "spark"), options)  # type: ignore[arg-type]

    assert result.input_rows == 2
    [record] = b.read(b.topic("activations"))
    assert record.key == b"acct-1"
    assert json.loads(record.body) == {
        "account_id": "acct-1",
        "program_id": "prog-1",
        "created_at": T0,
        "first_login_at": T0 + H,
        "activated": True,
    }
