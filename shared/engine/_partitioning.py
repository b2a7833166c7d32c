"""Which partition a key lands in: Kafka's default partitioner (murmur2), the same
function aiokafka, Faust and the Java client use, so every instance computes the
owner of a key without asking anyone.

It runs for every keyed record a worker sends and for every key it routes (a few per
input record), so it is written for CPython: the 4-byte words are unpacked in one call
rather than byte by byte as in aiokafka's reference version (several times slower), and
recent keys are remembered, since most workloads send many records per key (accounts,
programs)."""

from __future__ import annotations

import struct
from functools import lru_cache

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
#: Keys whose partition is remembered (a few MiB at most).
KEYS_REMEMBERED = 1 << 16


def murmur2(data: bytes) -> int:
    """MurmurHash2 of ``data`` as Kafka's Java client computes it (``Utils.murmur2``), unsigned."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    words = length >> 2
    for k in struct.unpack_from(f"<{words}I", data):
        k = (k * _M) & _MASK
        k ^= k >> 24
        h = ((h * _M) & _MASK) ^ ((k * _M) & _MASK)
    tail = length & 3
    if tail:
        at = words << 2
        if tail == 3:
            h ^= data[at + 2] << 16
        if tail >= 2:
            h ^= data[at + 1] << 8
        h = ((h ^ data[at]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


@lru_cache(maxsize=KEYS_REMEMBERED)
def partition_for(key: str | bytes, partitions: int) -> int:
    data = key.encode() if isinstance(key, str) else key
    return (murmur2(data) & 0x7FFFFFFF) % partitions
