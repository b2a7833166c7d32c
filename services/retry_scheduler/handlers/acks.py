"""Ordered retries: ``acknowledge`` reads the consumers' acknowledgements (``retry-acks``)
and forwards each to the inbox partition of its lane, where the lane's head is released.

Like ``route`` it keeps no state (the inbox handler alone changes the tables): a record read
twice is forwarded twice, and the second is ignored, its head being released already.
"""

from __future__ import annotations

import logging

from services.retry_scheduler.handlers.ordered import ack_record
from shared.engine import Engine, InputBatch, partition_for
from shared.ordered_retries import split_lane_key
from shared.settings import Settings
from shared.topics import TopicNames

log = logging.getLogger(__name__)


class Acks:
    def __init__(self, engine: Engine, settings: Settings, topics: TopicNames, inbox_topic: str) -> None:
        self.settings = settings
        self.inbox_topic = inbox_topic
        engine.handler(topics.retry_acks, name="retry-acks", offsets=None, sends=(inbox_topic,))(self.acknowledge)

    async def acknowledge(self, batch: InputBatch) -> None:
        for record in batch.records:
            lane, value = record.key, record.value
            try:
                if lane is None or not value:
                    raise ValueError("an acknowledgement needs the lane as key and the dlq.id as value")
                split_lane_key(lane)
                dlq_id = value.decode()
            except ValueError as exc:
                log.warning("ignoring acknowledgement at %s[%s]@%s: %s", record.topic, record.partition, record.offset, exc)
                continue
            partition = partition_for(lane, self.settings.topic_partitions)
            batch.send(self.inbox_topic, lane, ack_record(lane, dlq_id), partition=partition)
