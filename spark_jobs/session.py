"""Building the SparkSession every job uses.

Streaming state settings that a checkpoint remembers (state store provider, watermark
policy, join state format, shuffle partitions) are set here, once, before any query
starts, so every job and every restart agrees on them.

A job started by ``spark-submit`` keeps the master, jars and options spark-submit gave it;
started with ``python -m spark_jobs.<job>`` it uses ``--master`` (default
``STATEFLEET_SPARK_MASTER``, ``local[2]``) and resolves the Kafka connector itself.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from spark_jobs.config import SparkSettings
from spark_jobs.connector import resolve_connector_jars

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
#: Packages the jobs' Python code runs on executors (pure modules only; no Faust).
SHIPPED_PACKAGES = ("spark_jobs", "shared", "services")

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def streaming_conf(settings: SparkSettings) -> dict[str, str]:
    """Settings stored in a checkpoint at its first run; they must not change afterwards."""
    return {
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.streaming.multipleWatermarkPolicy": "min",
        "spark.sql.streaming.join.stateFormatVersion": "2",
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
    }


LOG4J_CONFIG = Path(__file__).resolve().parent / "log4j2.properties"


def base_conf(settings: SparkSettings, app_name: str) -> dict[str, str]:
    conf = {
        "spark.app.name": app_name,
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": str(settings.ui_enabled).lower(),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.warehouse.dir": str(settings.warehouse_dir.resolve()),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    conf.update(streaming_conf(settings))
    return conf


def launched_by_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _project_zip() -> str:
    """A zip of the packages executors import, for masters other than local."""
    path = Path(tempfile.mkdtemp(prefix="statefleet-pyfiles-")) / "statefleet.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for package in SHIPPED_PACKAGES:
            for file in (REPO / package).rglob("*.py"):
                zf.write(file, file.relative_to(REPO).as_posix())
    return str(path)


def build_session(
    job: str,
    settings: SparkSettings,
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    streaming: bool = False,
) -> SparkSession:
    """The session for ``job``; ``conf`` (e.g. from ``--conf``) wins over the defaults.

    ``streaming``: adaptive query execution is off (Spark does not use it for stateful
    streaming queries and says so on every start).
    """
    merged: dict[str, Any] = base_conf(settings, f"{settings.app_name_prefix}-{job}")
    if streaming:
        merged["spark.sql.adaptive.enabled"] = "false"
    submitted = launched_by_spark_submit()
    master_url = master or settings.master
    if not submitted:
        merged["spark.master"] = master_url
        jars = resolve_connector_jars(settings)
        merged["spark.jars"] = ",".join(jars)
        settings.local_dir.mkdir(parents=True, exist_ok=True)
        merged["spark.local.dir"] = str(settings.local_dir.resolve())
        if master_url.startswith("local"):
            # Python workers run this interpreter (with pandas and pyarrow) and import the
            # jobs' modules from the repository.
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
            os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    merged.update(conf or {})

    builder = SparkSession.builder
    for key, value in merged.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(settings.log_level)
    actual_master = spark.sparkContext.master or master_url
    if not actual_master.startswith("local"):
        spark.sparkContext.addPyFile(_project_zip())
    log.info("Spark %s session %r on %s", spark.version, spark.sparkContext.appName, actual_master)
    return spark


@contextmanager
def job_session(
    job: str,
    settings: SparkSettings,
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    streaming: bool = False,
) -> Iterator[SparkSession]:
    """:func:`build_session` for a job's ``main``; stops the session at the end unless it
    was already running (a caller's session, e.g. in tests, is left as it was)."""
    existing = SparkSession.getActiveSession()
    spark = build_session(job, settings, master=master, conf=conf, streaming=streaming)
    try:
        yield spark
    finally:
        if existing is None:
            spark.stop()
