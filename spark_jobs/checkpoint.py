"""Reading a streaming checkpoint's logs (offsets, commits, metadata) through Hadoop's
FileSystem, so local folders and cluster stores (HDFS, S3, ...) work the same way."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyspark.sql import SparkSession

from spark_jobs.hadoop_fs import HadoopFs


@dataclass(frozen=True)
class CheckpointState:
    """What a checkpoint says about its micro-batches."""

    query_id: str | None
    last_planned: int | None
    last_committed: int | None

    @property
    def pending_batch(self) -> int | None:
        """The batch that was planned but not committed: a restart runs it again."""
        if self.last_planned is None:
            return None
        if self.last_committed is None or self.last_committed < self.last_planned:
            return self.last_planned
        return None


def _max_batch(names: list[str]) -> int | None:
    ids = [int(n) for n in names if n.isdigit()]
    return max(ids) if ids else None


def read_checkpoint(spark: SparkSession, location: str) -> CheckpointState:
    fs = HadoopFs(spark, location)
    query_id = None
    if fs.exists("metadata"):
        query_id = json.loads(fs.read_text("metadata").splitlines()[0]).get("id")
    return CheckpointState(
        query_id=query_id, last_planned=_max_batch(fs.names("offsets")), last_committed=_max_batch(fs.names("commits"))
    )


def has_state(spark: SparkSession, location: str) -> bool:
    """True once a stateful query has committed state into the checkpoint."""
    return HadoopFs(spark, location).exists("state")


def batch_timestamp_ms(spark: SparkSession, location: str, batch_id: int) -> int | None:
    """When the driver planned ``batch_id`` (from the offset log), if it is still there."""
    fs = HadoopFs(spark, location)
    if not fs.exists("offsets", str(batch_id)):
        return None
    lines = fs.read_text("offsets", str(batch_id)).splitlines()
    for line in lines[1:2]:
        value = json.loads(line).get("batchTimestampMs")
        return int(value) if value is not None else None
    return None
