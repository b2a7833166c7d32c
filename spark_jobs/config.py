"""Spark settings of the jobs, from environment variables with the prefix ``STATEFLEET_SPARK_``.

Kafka connection and topic names are not here: they come from ``shared.settings.Settings``
(``STATEFLEET_KAFKA_*``, ``STATEFLEET_TOPIC_PREFIX``), like every other part of the fleet.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

LOCAL_ROOT = Path(".local/spark")

#: spark-token-provider-kafka-0-10_2.13 is published for 4.x only at 4.0.0 in the Maven
#: repositories the project resolves from; the connector runs with it at any 4.x version.
#: Also the default of spark.kafka.token.version in kafka-connector.pom.xml and of the
#: Dockerfile's SPARK_KAFKA_TOKEN_PROVIDER_VERSION.
KAFKA_TOKEN_PROVIDER_VERSION = "4.0.0"


def installed_pyspark_version() -> str:
    try:
        return version("pyspark")
    except PackageNotFoundError:  # pragma: no cover - pyspark is a dependency of the jobs
        import pyspark

        return str(pyspark.__version__)


class SparkSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STATEFLEET_SPARK_", extra="ignore")

    master: str = Field("local[2]", description="Spark master URL; --master overrides it")
    app_name_prefix: str = Field("statefleet", description="Spark application names are <prefix>-<job>")
    jars: str = Field(
        "",
        description="Comma-separated local jar paths of the Kafka connector and its dependencies, used with "
        "spark.jars instead of resolving them with Maven (for pods without network access)",
    )
    kafka_connector_version: str = Field(
        default_factory=installed_pyspark_version,
        description="Version of org.apache.spark:spark-sql-kafka-0-10_2.13; default: the installed pyspark's",
    )
    kafka_token_provider_version: str = Field(
        KAFKA_TOKEN_PROVIDER_VERSION,
        description="Version of org.apache.spark:spark-token-provider-kafka-0-10_2.13 (used only for Kafka "
        "delegation tokens, which the jobs do not use)",
    )
    jars_dir: Path = Field(LOCAL_ROOT / "jars", description="Where resolved connector jars are kept")
    maven: str = Field("mvn", description="Maven executable used to resolve the connector")

    checkpoint_dir: Path = Field(LOCAL_ROOT / "checkpoints", description="Root of streaming checkpoints")
    backfill_dir: Path = Field(LOCAL_ROOT / "backfill", description="Root of backfill outputs")
    archive_dir: Path = Field(LOCAL_ROOT / "archive", description="Parquet archive of account-events")
    warehouse_dir: Path = Field(LOCAL_ROOT / "warehouse", description="spark.sql.warehouse.dir")
    local_dir: Path = Field(LOCAL_ROOT / "tmp", description="spark.local.dir (shuffle and spill files)")

    shuffle_partitions: int = Field(4, ge=1, description="spark.sql.shuffle.partitions; fixed per checkpoint")
    max_offsets_per_trigger: int = Field(
        200_000, ge=1, description="Records read per micro-batch and topic, so a backlog is taken in steps"
    )
    kafka_isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    log_level: str = Field("WARN", description="Log level of Spark's own (JVM) loggers")
    ui_enabled: bool = Field(False, description="Start the Spark web UI (port 4040+)")


def load_spark_settings() -> SparkSettings:
    return SparkSettings()
