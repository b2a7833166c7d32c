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

The rest of this surface is what services and their HTTP APIs need around that: topic
creation, the partitioner, running the worker and serving the API on its loop
(:meth:`Engine.run`, :meth:`Engine.serve`), and the running instance as the API sees it
(:class:`Instance`: readiness, partitions, copies, peers, and the requests peers send).

Tools, benchmarks and Spark jobs use plain Kafka clients with the same connection settings:
those are in :mod:`shared.engine.clients`.

Inside the package, the private parts of Faust and aiokafka that the engine relies on (the
steps of Faust's consumer, recovery and assignor it replaces, a partition's RocksDB handle,
the group coordinator) are reached from one module, ``_faust.py``; the rest of the engine
uses its functions and its ``*Hooks`` base classes.
"""

from shared.engine._access import BrokerAccessDenied
from shared.engine._admin import TopicSpec, ensure_topics
from shared.engine._app import app_id
from shared.engine._batch import DeadLetterRoute, InputBatch
from shared.engine._copies import Copy
from shared.engine._durable import DurableTable as Table
from shared.engine._durable import InRecord as Record
from shared.engine._durable import OrderedRows
from shared.engine._engine import Engine, SendFailed
from shared.engine._instance import Instance
from shared.engine._partitioning import partition_for
from shared.engine._producer import Outgoing
from shared.engine._rocksdb import SharedMemoryOptions

__all__ = [
    "BrokerAccessDenied",
    "Copy",
    "DeadLetterRoute",
    "Engine",
    "InputBatch",
    "Instance",
    "OrderedRows",
    "Outgoing",
    "Record",
    "SendFailed",
    "SharedMemoryOptions",
    "Table",
    "TopicSpec",
    "app_id",
    "ensure_topics",
    "partition_for",
]
