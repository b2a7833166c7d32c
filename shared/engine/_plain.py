"""Plain Kafka clients (no group, no Faust) for tools, jobs and demos, from the one client
library the engine is built on: they get it here rather than importing it themselves."""

from aiokafka import AIOKafkaConsumer as PlainConsumer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.admin import AIOKafkaAdminClient as PlainAdmin

from shared.engine._faust import kafka_client
from shared.engine._producer import TopicTrackingProducer as PlainProducer

__all__ = ["KafkaTopicPartition", "PlainAdmin", "PlainConsumer", "PlainProducer", "refresh_metadata"]


async def refresh_metadata(client: PlainConsumer) -> None:
    """Fetch cluster metadata now (a topic created since the client started becomes known)."""
    await kafka_client(client).force_metadata_update()
