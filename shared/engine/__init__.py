"""statefleet's engine: the one seam between the services and Faust, aiokafka and mode.

Nothing outside this package imports those three (the lint enforces it). A service
builds an :class:`Engine`, declares its tables and registers batch handlers; each
handler gets one input partition's records (:class:`InputBatch`) and stages what they
produce, and the engine commits it: sends acknowledged, then the changelogs, then the
local tables with the input's next offset in one RocksDB write batch.

A service and its HTTP API touch a table only through its :class:`Table` handle: its
rows (ordered scans and views that leave out the engine's own rows), the partitions this
instance owns, the owner of each partition (query forwarding) and this instance's copy of
it (reads from copies); no Faust table reaches them.

The rest of this surface is what services and their HTTP APIs need around that:
topic creation, the partitioner, running the worker, the fleet view (GET /instance), and
hearing from a peer that it is restarting (the peer watch, which moves a dead peer's
partitions at once).
"""

from shared.engine._admin import TopicSpec, ensure_topics, ensure_topics_async
from shared.engine._app import App, app_id, run_worker, serve_api
from shared.engine._batch import DeadLetterRoute, InputBatch
from shared.engine._clients import client_kwargs
from shared.engine._copies import Copy, assigned_copies
from shared.engine._coverage import ready, unowned_input_topics
from shared.engine._durable import DurableTable as Table
from shared.engine._durable import InRecord as Record
from shared.engine._durable import OrderedRows
from shared.engine._engine import Engine, SendFailed
from shared.engine._internals import (
    assigned_partitions,
    changelog_topics,
    input_lag,
    known_instance_urls,
)
from shared.engine._membership import note_peer_restarting
from shared.engine._partitioning import partition_for
from shared.engine._plain import KafkaTopicPartition, PlainAdmin, PlainConsumer, PlainProducer, refresh_metadata
from shared.engine._producer import Outgoing
from shared.engine._rocksdb import SharedMemoryOptions
from shared.engine._warmup import rejoin_for_peer, warmup_partitions

__all__ = [
    "App",
    "Copy",
    "DeadLetterRoute",
    "Engine",
    "InputBatch",
    "KafkaTopicPartition",
    "OrderedRows",
    "Outgoing",
    "PlainAdmin",
    "PlainConsumer",
    "PlainProducer",
    "Record",
    "SendFailed",
    "SharedMemoryOptions",
    "Table",
    "TopicSpec",
    "app_id",
    "assigned_copies",
    "assigned_partitions",
    "changelog_topics",
    "client_kwargs",
    "ensure_topics",
    "ensure_topics_async",
    "input_lag",
    "known_instance_urls",
    "note_peer_restarting",
    "partition_for",
    "ready",
    "refresh_metadata",
    "rejoin_for_peer",
    "run_worker",
    "serve_api",
    "unowned_input_topics",
    "warmup_partitions",
]
