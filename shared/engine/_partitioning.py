"""Which partition a key lands in: Kafka's default partitioner (murmur2), the same
function aiokafka, Faust and the Java client use, so every instance computes the
owner of a key without asking anyone."""

from __future__ import annotations

from aiokafka.partitioner import murmur2


def partition_for(key: str | bytes, partitions: int) -> int:
    data = key.encode() if isinstance(key, str) else key
    return int(murmur2(data) & 0x7FFFFFFF) % partitions
