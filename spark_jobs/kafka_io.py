"""Reading and writing Kafka from Spark with the official connector, configured from the
fleet's settings (bootstrap servers, TLS, SASL) so the jobs reach the same cluster as
the services.

Batch reads take explicit offset ranges, looked up first with aiokafka, so a job knows
(and records) exactly which records it read; streaming reads start from the earliest
offsets and take at most ``STATEFLEET_SPARK_MAX_OFFSETS_PER_TRIGGER`` records per topic
and micro-batch.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from shared.engine.clients import KafkaTopicPartition, PlainConsumer, TopicSpec, client_kwargs, ensure_topics, refresh_metadata
from shared.settings import Settings
from spark_jobs.config import SparkSettings


class KafkaJobError(RuntimeError):
    """A topic the job needs is missing or unreadable; the message says what to do."""


def _jaas(settings: Settings) -> str:
    user = (settings.kafka_sasl_username or "").replace('"', '\\"')
    password = (settings.kafka_sasl_password or "").replace('"', '\\"')
    module = (
        "org.apache.kafka.common.security.plain.PlainLoginModule"
        if settings.kafka_sasl_mechanism.upper() == "PLAIN"
        else "org.apache.kafka.common.security.scram.ScramLoginModule"
    )
    return f'{module} required username="{user}" password="{password}";'


def client_options(settings: Settings) -> dict[str, str]:
    """Kafka client settings (without the ``kafka.`` prefix Spark's options use)."""
    opts = {"bootstrap.servers": settings.kafka_bootstrap_servers, "security.protocol": settings.kafka_security_protocol}
    if settings.kafka_security_protocol.startswith("SASL"):
        if not settings.kafka_sasl_username or not settings.kafka_sasl_password:
            raise KafkaJobError(
                f"{settings.kafka_security_protocol} needs STATEFLEET_KAFKA_SASL_USERNAME and STATEFLEET_KAFKA_SASL_PASSWORD"
            )
        opts["sasl.mechanism"] = settings.kafka_sasl_mechanism
        opts["sasl.jaas.config"] = _jaas(settings)
    if settings.kafka_security_protocol in ("SSL", "SASL_SSL"):
        if settings.kafka_ssl_cafile:
            opts["ssl.truststore.type"] = "PEM"
            opts["ssl.truststore.location"] = settings.kafka_ssl_cafile
        if settings.kafka_ssl_certfile and settings.kafka_ssl_keyfile:
            opts["ssl.keystore.type"] = "PEM"
            opts["ssl.keystore.certificate.chain"] = Path(settings.kafka_ssl_certfile).read_text()
            opts["ssl.keystore.key"] = Path(settings.kafka_ssl_keyfile).read_text()
    return opts


def spark_kafka_options(settings: Settings) -> dict[str, str]:
    return {f"kafka.{k}": v for k, v in client_options(settings).items()}


# -- offset ranges -------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicRange:
    """Per partition: the first offset and the end offset (one past the last record) read."""

    topic: str
    start: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)

    @property
    def records(self) -> int:
        """Offsets in the range (records, plus any transaction markers or compacted gaps)."""
        return sum(self.end[p] - self.start[p] for p in self.end)

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partitions": {str(p): {"start": self.start[p], "end": self.end[p]} for p in sorted(self.end)},
        }


async def _ranges(settings: Settings, topics: Iterable[str], isolation_level: str) -> dict[str, TopicRange | None]:
    consumer = PlainConsumer(enable_auto_commit=False, isolation_level=isolation_level, **client_kwargs(settings))
    await consumer.start()
    try:
        out: dict[str, TopicRange | None] = {}
        for topic in topics:
            partitions = consumer.partitions_for_topic(topic)
            if not partitions:
                await refresh_metadata(consumer)  # metadata refresh for a new topic
                partitions = consumer.partitions_for_topic(topic)
            if not partitions:
                out[topic] = None
                continue
            tps = [KafkaTopicPartition(topic, p) for p in sorted(partitions)]
            starts = await consumer.beginning_offsets(tps)
            ends = await consumer.end_offsets(tps)
            out[topic] = TopicRange(topic, {tp.partition: starts[tp] for tp in tps}, {tp.partition: ends[tp] for tp in tps})
        return out
    finally:
        await consumer.stop()


def offset_ranges(settings: Settings, topics: Iterable[str], isolation_level: str) -> dict[str, TopicRange | None]:
    """Earliest and current end offsets of each topic; ``None`` for a topic that does not exist."""
    return asyncio.run(_ranges(settings, list(topics), isolation_level))


def existing_topics(settings: Settings, topics: Iterable[str]) -> set[str]:
    """The names among ``topics`` that exist on the cluster."""
    return {t for t, r in offset_ranges(settings, topics, "read_uncommitted").items() if r is not None}


def ensure(settings: Settings, topics: Iterable[str]) -> None:
    """Create missing topics with the fleet's partition count (existing ones are left alone)."""
    ensure_topics(settings, [TopicSpec(t, settings.topic_partitions) for t in topics])


# -- reading and writing -------------------------------------------------------------------------


def read_batch(spark: SparkSession, settings: Settings, spark_settings: SparkSettings, ranges: Iterable[TopicRange]) -> DataFrame:
    """The records of ``ranges``, exactly (``assign`` with explicit start and end offsets).

    Columns: key, value (binary), topic, partition, offset, timestamp, timestampType, headers.
    """
    ranges = [r for r in ranges if r.end]
    if not ranges:
        raise KafkaJobError("nothing to read: the topics have no partitions")
    assign = {r.topic: sorted(r.end) for r in ranges}
    starting = {r.topic: {str(p): o for p, o in r.start.items()} for r in ranges}
    ending = {r.topic: {str(p): o for p, o in r.end.items()} for r in ranges}
    return (
        spark.read.format("kafka")
        .options(**spark_kafka_options(settings))
        .option("kafka.isolation.level", spark_settings.kafka_isolation_level)
        .option("assign", json.dumps(assign))
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        .option("includeHeaders", "true")
        .load()
    )


def read_stream(
    spark: SparkSession,
    settings: Settings,
    spark_settings: SparkSettings,
    topic: str,
    *,
    max_offsets_per_trigger: int | None = None,
    include_headers: bool = False,
) -> DataFrame:
    """A streaming read of ``topic`` from its earliest offsets (a checkpoint resumes where it stopped)."""
    return (
        spark.readStream.format("kafka")
        .options(**spark_kafka_options(settings))
        .option("kafka.isolation.level", spark_settings.kafka_isolation_level)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_offsets_per_trigger or spark_settings.max_offsets_per_trigger))
        .option("includeHeaders", str(include_headers).lower())
        .option("failOnDataLoss", "true")
        .load()
    )


def write_batch(df: DataFrame, settings: Settings, topic: str | None = None) -> None:
    """Write ``df`` (key, value, optional headers/topic columns) to Kafka; ``topic`` unless rows name one."""
    writer = df.write.format("kafka").options(**spark_kafka_options(settings))
    if topic is not None:
        writer = writer.option("topic", topic)
    writer.save()


def ranges_json(ranges: Mapping[str, TopicRange]) -> list[dict[str, Any]]:
    return [ranges[t].to_json() for t in sorted(ranges)]
