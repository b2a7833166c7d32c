"""Connector resolution, with a stand-in for Maven that serves only some versions."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from spark_jobs.config import SparkSettings, installed_pyspark_version
from spark_jobs.connector import ConnectorError, ConnectorVersions, resolve_connector_jars

pytestmark = pytest.mark.spark

FAKE_MAVEN = """#!/usr/bin/env python3
import sys
from pathlib import Path
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("-D") and "=" in a)
with open(Path(__file__).with_suffix(".calls"), "a") as log:
    log.write(args["spark.kafka.version"] + "/" + args["spark.kafka.token.version"] + "\\n")
if args["spark.kafka.version"] not in {SERVED}:
    print("[ERROR] Could not find artifact spark-sql-kafka-0-10_2.13:" + args["spark.kafka.version"])
    sys.exit(1)
out = Path(args["outputDirectory"])
out.mkdir(parents=True)
for name in ("spark-sql-kafka-0-10_2.13-{0}.jar", "spark-token-provider-kafka-0-10_2.13-{1}.jar", "kafka-clients.jar"):
    (out / name.format(args["spark.kafka.version"], args["spark.kafka.token.version"])).write_bytes(b"jar")
"""


def fake_maven(tmp_path: Path, served: set[str]) -> Path:
    path = tmp_path / "mvn"
    path.write_text(FAKE_MAVEN.replace("{SERVED}", repr(served)))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def calls(maven: Path) -> list[str]:
    log = maven.with_suffix(".calls")
    return log.read_text().split() if log.exists() else []


def names(jars: list[str]) -> list[str]:
    return sorted(Path(j).name for j in jars)


def test_the_pyspark_version_and_token_provider_4_0_0_are_the_defaults(tmp_path: Path, caplog) -> None:
    v = installed_pyspark_version()
    maven = fake_maven(tmp_path, {v})
    settings = SparkSettings(maven=str(maven), jars_dir=tmp_path / "jars")
    with caplog.at_level(logging.INFO, logger="spark_jobs.connector"):
        assert names(resolve_connector_jars(settings)) == sorted(
            ["kafka-clients.jar", f"spark-sql-kafka-0-10_2.13-{v}.jar", "spark-token-provider-kafka-0-10_2.13-4.0.0.jar"]
        )
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert resolve_connector_jars(settings)  # second time from the folder, without Maven
    assert calls(maven) == [f"{v}/4.0.0"]


def test_the_cache_is_keyed_by_versions_and_pom(tmp_path: Path) -> None:
    v = installed_pyspark_version()
    maven = fake_maven(tmp_path, {v, "9.9.9"})
    jars_dir = tmp_path / "jars"
    # What an earlier resolution left: jars of other versions, and a folder named like this
    # resolution but without its jars.
    (jars_dir / "9.9.9-4.0.0").mkdir(parents=True)
    (jars_dir / "9.9.9-4.0.0" / "spark-sql-kafka-0-10_2.13-9.9.9.jar").write_bytes(b"jar")
    folder = jars_dir / ConnectorVersions(v, "4.0.0").folder_name()
    folder.mkdir()
    (folder / "spark-sql-kafka-0-10_2.13-9.9.9.jar").write_bytes(b"jar")
    settings = SparkSettings(maven=str(maven), jars_dir=jars_dir)
    assert f"spark-sql-kafka-0-10_2.13-{v}.jar" in names(resolve_connector_jars(settings))
    assert "spark-sql-kafka-0-10_2.13-9.9.9.jar" not in names(resolve_connector_jars(settings))
    assert calls(maven) == [f"{v}/4.0.0"]

    other = SparkSettings(
        maven=str(maven), jars_dir=jars_dir, kafka_connector_version="9.9.9", kafka_token_provider_version="9.9.8"
    )
    assert names(resolve_connector_jars(other)) == [
        "kafka-clients.jar",
        "spark-sql-kafka-0-10_2.13-9.9.9.jar",
        "spark-token-provider-kafka-0-10_2.13-9.9.8.jar",
    ]
    assert calls(maven) == [f"{v}/4.0.0", "9.9.9/9.9.8"]
    assert ConnectorVersions(v, "4.0.0").folder_name().startswith(f"{v}-4.0.0-")


def test_a_connector_other_than_pysparks_is_used_with_a_warning(tmp_path: Path, caplog) -> None:
    settings = SparkSettings(
        maven=str(fake_maven(tmp_path, {"9.9.9"})), jars_dir=tmp_path / "jars", kafka_connector_version="9.9.9"
    )
    with caplog.at_level(logging.WARNING, logger="spark_jobs.connector"):
        assert "spark-sql-kafka-0-10_2.13-9.9.9.jar" in names(resolve_connector_jars(settings))
    assert "versions differ" in caplog.text


def test_unresolvable_versions_fail_with_what_to_do(tmp_path: Path) -> None:
    settings = SparkSettings(maven=str(fake_maven(tmp_path, set())), jars_dir=tmp_path / "jars", kafka_connector_version="9.9.9")
    with pytest.raises(ConnectorError, match="STATEFLEET_SPARK_JARS") as info:
        resolve_connector_jars(settings)
    assert "Could not find artifact spark-sql-kafka-0-10_2.13:9.9.9" in str(info.value)
    assert not list((tmp_path / "jars").iterdir())  # nothing half-resolved is left


def test_explicit_jars_skip_maven(tmp_path: Path) -> None:
    jar = tmp_path / "a.jar"
    jar.write_bytes(b"jar")
    settings = SparkSettings(maven="/nonexistent/mvn", jars=f"{jar}, ")
    assert resolve_connector_jars(settings) == [str(jar)]
    with pytest.raises(ConnectorError, match=r"do not exist: /nope\.jar"):
        resolve_connector_jars(SparkSettings(jars=f"{jar},/nope.jar"))
