"""statefleet's engine: the one seam between the services and Faust.

A service builds an :class:`Engine`, declares its tables and registers batch handlers;
each handler gets one input partition's records (:class:`InputBatch`) and stages what
they produce, and the engine commits it (sends acknowledged, then changelogs, then the
local tables with the input's next offset).
"""

from shared.durable import DurableTable as Table
from shared.durable import InRecord as Record
from shared.engine._batch import DeadLetterRoute, InputBatch
from shared.engine._engine import Engine, Handler
from shared.engine._producer import Outgoing

__all__ = ["DeadLetterRoute", "Engine", "Handler", "InputBatch", "Outgoing", "Record", "Table"]
