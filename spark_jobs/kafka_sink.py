"""A ``foreachBatch`` sink that writes each micro-batch to a Kafka topic once.

Spark's Kafka sink is at-least-once: when a job dies after writing a micro-batch but
before committing it, the restarted job runs that batch again and writes it twice. This
sink tags every record with the query's id and the batch id (headers
``statefleet.spark.query`` and ``statefleet.spark.batch``). The one batch a restart runs
again (planned in the offset log, missing from the commit log) is first compared with
what the topic already holds for it, and only the records not yet there are written.
A re-run batch produces the same records (same offsets, same state version), so the
comparison is by key and value.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from shared.settings import Settings
from spark_jobs import kafka_io
from spark_jobs.checkpoint import batch_timestamp_ms, read_checkpoint
from spark_jobs.config import SparkSettings

log = logging.getLogger(__name__)

QUERY_HEADER = "statefleet.spark.query"
BATCH_HEADER = "statefleet.spark.batch"
#: How far before a batch's planning time its records may carry timestamps (clock skew).
CLOCK_SKEW_MS = 10 * 60 * 1000


def _header(headers: str, name: str) -> Column:
    """The value (as a string) of header ``name`` in an array<struct<key,value>> column."""
    return F.expr(f"element_at(filter({headers}, h -> h.key = '{name}'), -1).value").cast("string")


class KafkaBatchSink:
    """Call with ``(batch_df, batch_id)``; ``batch_df`` has binary or string ``key`` and ``value``."""

    def __init__(
        self,
        spark: SparkSession,
        settings: Settings,
        spark_settings: SparkSettings,
        topic: str,
        checkpoint: str,
        on_written: Callable[[int, int], None] | None = None,
    ) -> None:
        self.spark = spark
        self.settings = settings
        self.spark_settings = spark_settings
        self.topic = topic
        self.checkpoint = checkpoint
        self.pending = read_checkpoint(spark, checkpoint).pending_batch
        self.on_written = on_written
        self._query_id: str | None = None
        if self.pending is not None:
            log.info(
                "batch %d of %s was not committed: its records already in %s will not be written again",
                self.pending,
                checkpoint,
                topic,
            )

    def query_id(self) -> str:
        if self._query_id is None:
            self._query_id = read_checkpoint(self.spark, self.checkpoint).query_id or "unknown"
        return self._query_id

    def already_written(self, batch_id: int) -> DataFrame:
        """(key, value) of the records this query wrote for ``batch_id`` before a restart."""
        planned = batch_timestamp_ms(self.spark, self.checkpoint, batch_id)
        reader = (
            self.spark.read.format("kafka")
            .options(**kafka_io.spark_kafka_options(self.settings))
            .option("subscribe", self.topic)
            .option("includeHeaders", "true")
        )
        if planned is not None:
            # partitions with nothing that recent are read from their end (nothing)
            reader = reader.option("startingTimestamp", str(max(0, planned - CLOCK_SKEW_MS))).option(
                "startingOffsetsByTimestampStrategy", "latest"
            )
        else:
            reader = reader.option("startingOffsets", "earliest")
        written = reader.load()
        return (
            written.where(
                (_header("headers", QUERY_HEADER) == self.query_id()) & (_header("headers", BATCH_HEADER) == str(batch_id))
            )
            .select(F.col("key").cast("binary").alias("key"), F.col("value").cast("binary").alias("value"))
            .distinct()
        )

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        rows = batch_df.select(F.col("key").cast("binary").alias("key"), F.col("value").cast("binary").alias("value"))
        if batch_id == self.pending:
            rows = rows.join(self.already_written(batch_id), ["key", "value"], "left_anti")
        headers = F.array(
            F.struct(F.lit(QUERY_HEADER).alias("key"), F.lit(self.query_id()).cast("binary").alias("value")),
            F.struct(F.lit(BATCH_HEADER).alias("key"), F.lit(str(batch_id)).cast("binary").alias("value")),
        )
        out = rows.withColumn("headers", headers).persist()
        try:
            count = out.count()
            if count:
                kafka_io.write_batch(out, self.settings, self.topic)
            if self.on_written is not None:
                self.on_written(batch_id, count)
        finally:
            out.unpersist()
