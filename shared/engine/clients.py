"""Plain Kafka clients, for the tools, benchmarks and Spark jobs around the services: an
admin client, a consumer and a producer with the fleet's connection settings (security
included), the topic creation the services use (and its wait for the new topics' leaders), the deletion of a
prefix's topics, and a metadata refresh.

Services do not use these: they read and write through their :class:`shared.engine.Engine`.
Like the rest of the engine, this module is where aiokafka is reached from outside.
"""

from shared.engine._admin import (
    TopicSpec,
    delete_topics_with_prefix,
    ensure_topics,
    ensure_topics_async,
    replication_factor,
    resolve_replication_factor,
    until_led,
)
from shared.engine._clients import ISOLATION_LEVEL, client_kwargs
from shared.engine._plain import KafkaTopicPartition, PlainAdmin, PlainConsumer, PlainProducer, refresh_metadata

__all__ = [
    "ISOLATION_LEVEL",
    "KafkaTopicPartition",
    "PlainAdmin",
    "PlainConsumer",
    "PlainProducer",
    "TopicSpec",
    "client_kwargs",
    "delete_topics_with_prefix",
    "ensure_topics",
    "ensure_topics_async",
    "refresh_metadata",
    "replication_factor",
    "resolve_replication_factor",
    "until_led",
]
