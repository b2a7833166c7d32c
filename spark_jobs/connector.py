"""The jars of Spark's official Kafka connector, resolved from Maven Central with Maven.

``spark_jobs/kafka-connector.pom.xml`` names ``spark-sql-kafka-0-10_2.13`` and
``spark-token-provider-kafka-0-10_2.13``; ``mvn dependency:copy-dependencies`` copies them
with ``kafka-clients`` and ``commons-pool2`` into a folder of ``STATEFLEET_SPARK_JARS_DIR``
named after both versions and the POM's content, once per machine. The session adds them
with ``spark.jars``, which also ships them to a cluster's executors.

The connector's version is the installed pyspark's (``STATEFLEET_SPARK_KAFKA_CONNECTOR_VERSION``
overrides it, with a warning when it differs); the token provider's is
``STATEFLEET_SPARK_KAFKA_TOKEN_PROVIDER_VERSION`` (default ``4.0.0``). Other versions, or a
changed POM, resolve into a folder of their own. ``STATEFLEET_SPARK_JARS`` skips all of
this and uses the jars it lists.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from spark_jobs.config import SparkSettings, installed_pyspark_version

log = logging.getLogger(__name__)

POM = Path(__file__).resolve().parent / "kafka-connector.pom.xml"
CONNECTOR_ARTIFACT = "org.apache.spark:spark-sql-kafka-0-10_2.13"


class ConnectorError(RuntimeError):
    """The connector's jars could not be found or resolved; the message says what to do."""


@dataclass(frozen=True)
class ConnectorVersions:
    connector: str
    token_provider: str

    @property
    def jar_names(self) -> tuple[str, str]:
        """File names of the connector's and the token provider's jars, as Maven copies them."""
        return (
            f"spark-sql-kafka-0-10_2.13-{self.connector}.jar",
            f"spark-token-provider-kafka-0-10_2.13-{self.token_provider}.jar",
        )

    def folder_name(self) -> str:
        """``<connector>-<token provider>-<POM digest>``: a resolution is reused only for the same inputs."""
        digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:12]
        return f"{self.connector}-{self.token_provider}-{digest}"


def configured_versions(settings: SparkSettings) -> ConnectorVersions:
    return ConnectorVersions(connector=settings.kafka_connector_version, token_provider=settings.kafka_token_provider_version)


def explicit_jars(settings: SparkSettings) -> list[str]:
    """The jars listed in ``STATEFLEET_SPARK_JARS``; each must exist."""
    jars = [j.strip() for j in settings.jars.split(",") if j.strip()]
    missing = [j for j in jars if not Path(j).is_file()]
    if missing:
        raise ConnectorError(f"STATEFLEET_SPARK_JARS lists files that do not exist: {', '.join(missing)}")
    return jars


def _complete(folder: Path, versions: ConnectorVersions) -> list[str]:
    """The folder's jars if it holds both of ``versions``' jars, else an empty list."""
    if not all((folder / name).is_file() for name in versions.jar_names):
        return []
    return sorted(str(p.resolve()) for p in folder.glob("*.jar"))


def _maven_copy(settings: SparkSettings, versions: ConnectorVersions, target: Path) -> None:
    if shutil.which(settings.maven) is None:
        raise ConnectorError(
            "Maven is needed to resolve Spark's Kafka connector: install it (e.g. apt-get install maven), "
            "or list the connector's jars in STATEFLEET_SPARK_JARS"
        )
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    cmd = [
        settings.maven,
        "-q",
        "-B",
        "-f",
        str(POM),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={staging.resolve()}",
        "-DincludeScope=runtime",
        f"-Dspark.kafka.version={versions.connector}",
        f"-Dspark.kafka.token.version={versions.token_provider}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not _complete(staging, versions):
        shutil.rmtree(staging, ignore_errors=True)
        output = (proc.stdout + proc.stderr).strip()[-3000:]
        raise ConnectorError(
            f"Maven could not resolve {CONNECTOR_ARTIFACT}:{versions.connector} with "
            f"spark-token-provider-kafka-0-10_2.13:{versions.token_provider}. Check network access to Maven "
            "Central, choose versions with STATEFLEET_SPARK_KAFKA_CONNECTOR_VERSION and "
            "STATEFLEET_SPARK_KAFKA_TOKEN_PROVIDER_VERSION, or list local jars in STATEFLEET_SPARK_JARS. "
            f"Maven said:\n{output}"
        )
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def resolve_connector_jars(settings: SparkSettings) -> list[str]:
    """Local paths of the connector's jars, resolving them with Maven the first time."""
    if settings.jars.strip():
        return explicit_jars(settings)
    versions = configured_versions(settings)
    spark_version = installed_pyspark_version()
    if versions.connector != spark_version:
        log.warning("Kafka connector %s runs on Spark %s (versions differ)", versions.connector, spark_version)
    target = settings.jars_dir / versions.folder_name()
    jars = _complete(target, versions)
    if not jars:
        log.info(
            "resolving %s:%s (token provider %s) from Maven Central into %s",
            CONNECTOR_ARTIFACT,
            versions.connector,
            versions.token_provider,
            target,
        )
        settings.jars_dir.mkdir(parents=True, exist_ok=True)
        _maven_copy(settings, versions, target)
        jars = _complete(target, versions)
    return jars
