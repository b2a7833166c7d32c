"""A service's topology as its registrations declare it, printed as Kafka Streams'
``Topology.describe()`` prints one: ``python -m services.<name> --describe``.

Each handler is a node: the topics it reads (its sources), the tables it writes and keeps
its input's next offsets in, and the topics it declared it sends to (its sinks; a topic
named at run time, such as a dead letter's retry topic, is declared by what names it, in
angle brackets). Handlers that write a common table share a lane: their batches of one
partition number run in turn, never side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class HandlerNode:
    name: str
    lane: int
    sources: tuple[str, ...]
    #: The tables it writes (its next offsets among their rows); empty for a stateless handler.
    tables: tuple[str, ...]
    #: None: not declared.
    sinks: tuple[str, ...] | None
    #: Partitions of its sources when they are the service's own topics.
    internal_partitions: int | None = None


@dataclass(frozen=True)
class Topology:
    service: str
    handlers: tuple[HandlerNode, ...]
    #: Table name -> partitions.
    tables: tuple[tuple[str, int], ...]

    def __str__(self) -> str:
        lines = [f"Topology: {self.service}"]
        for table, partitions in self.tables:
            lines.append(f"  Table: {table} ({partitions} partitions, compacted changelog)")
        for node in self.handlers:
            own = f", internal with {node.internal_partitions} partitions" if node.internal_partitions is not None else ""
            lines.append(f"  Handler: {node.name} (lane {node.lane})")
            lines.append(f"    <-- sources: {_names(node.sources)}{own}")
            lines.append(f"    --- tables: {_names(node.tables) if node.tables else '(none: stateless, at least once)'}")
            sinks = "(not declared)" if node.sinks is None else _names(node.sinks) or "(none)"
            lines.append(f"    --> sinks: {sinks}")
        return "\n".join(lines)


def _names(names: Sequence[str]) -> str:
    return ", ".join(names)
