"""statefleet's engine: the one seam between the services and Faust, aiokafka and mode.

Nothing outside this package imports those three (the lint enforces it). A service
builds an :class:`Engine`, declares its tables and registers batch handlers; each
handler gets one input partition's records (:class:`InputBatch`) and stages what they
produce, and the engine commits it: sends acknowledged, then the changelogs, then the
local tables with the input's next offset in one RocksDB write batch.

The rest of this surface is what services and their HTTP APIs need around that:
topic creation, the partitioner, the owner of a partition (query forwarding), ordered
reads of a table partition (range scans), running the worker, and hearing from a
peer that it is restarting (the peer watch, which moves a dead peer's partitions at once).
"""

from shared.engine._admin import TopicSpec, ensure_topics, ensure_topics_async
from shared.engine._app import App, app_id, changelog_topic_specs, run_worker, serve_api
from shared.engine._batch import DeadLetterRoute, InputBatch, StagedView
from shared.engine._clients import client_kwargs
from shared.engine._copies import Copy, assigned_copies, local_copy
from shared.engine._coverage import ready
from shared.engine._durable import DurableTable as Table
from shared.engine._durable import InRecord as Record
from shared.engine._durable import is_next_offset_key, state_items
from shared.engine._engine import Engine, Handler, SendFailed
from shared.engine._internals import (
    FAUST_OFFSET_KEY,
    AnyTable,
    TopicPartition,
    active_partitions,
    all_owner_urls,
    assigned_partitions,
    changelog_topics,
    input_lag,
    known_instance_urls,
    partition_db,
    partition_items,
    partition_owner_url,
)
from shared.engine._membership import note_peer_restarting
from shared.engine._partitioning import partition_for
from shared.engine._plain import KafkaTopicPartition, PlainAdmin, PlainConsumer, PlainProducer, refresh_metadata
from shared.engine._producer import Outgoing
from shared.engine._rocksdb import SharedMemoryOptions
from shared.engine._warmup import rejoin_for_peer, warmup_partitions

__all__ = [
    "FAUST_OFFSET_KEY",
    "AnyTable",
    "App",
    "Copy",
    "DeadLetterRoute",
    "Engine",
    "Handler",
    "InputBatch",
    "KafkaTopicPartition",
    "Outgoing",
    "PlainAdmin",
    "PlainConsumer",
    "PlainProducer",
    "Record",
    "SendFailed",
    "SharedMemoryOptions",
    "StagedView",
    "Table",
    "TopicPartition",
    "TopicSpec",
    "active_partitions",
    "all_owner_urls",
    "app_id",
    "assigned_copies",
    "assigned_partitions",
    "changelog_topic_specs",
    "changelog_topics",
    "client_kwargs",
    "ensure_topics",
    "ensure_topics_async",
    "input_lag",
    "is_next_offset_key",
    "known_instance_urls",
    "local_copy",
    "note_peer_restarting",
    "partition_db",
    "partition_for",
    "partition_items",
    "partition_owner_url",
    "ready",
    "refresh_metadata",
    "rejoin_for_peer",
    "run_worker",
    "serve_api",
    "state_items",
    "warmup_partitions",
]
