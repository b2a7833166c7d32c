"""The engine's partitioner is Kafka's: the same partition as the Java client and aiokafka for any key."""

from __future__ import annotations

import ctypes

from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from shared.engine import partition_for
from shared.engine._partitioning import murmur2


def test_murmur2_gives_the_java_clients_values() -> None:
    # org.apache.kafka.common.utils.UtilsTest#testMurmur2 (signed 32-bit in Java)
    assert ctypes.c_int32(murmur2(b"21")).value == -973932308
    assert ctypes.c_int32(murmur2(b"foobar")).value == -790332482
    assert ctypes.c_int32(murmur2(b"a-little-bit-long-string")).value == -985981536
    assert ctypes.c_int32(murmur2(b"a-little-bit-longer-string")).value == -1486304829
    assert ctypes.c_int32(murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8")).value == -58897971


@given(st.binary(max_size=200))
def test_murmur2_agrees_with_aiokafkas_for_any_bytes(data: bytes) -> None:
    assert murmur2(data) == aiokafka_murmur2(data) & 0xFFFFFFFF


@given(st.text(max_size=60), st.integers(1, 64))
def test_a_key_as_text_or_bytes_lands_where_aiokafka_puts_it(key: str, partitions: int) -> None:
    expected = (aiokafka_murmur2(key.encode()) & 0x7FFFFFFF) % partitions
    assert partition_for(key, partitions) == expected
    assert partition_for(key.encode(), partitions) == expected
    assert partition_for(key, partitions) == expected  # remembered: the same answer again
