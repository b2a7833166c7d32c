from __future__ import annotations

import pytest
from aiokafka.partitioner import DefaultPartitioner

from shared.engine._partitioning import partition_for
from shared.http.errors import ApiError
from shared.http.pagination import decode_cursor, encode_cursor, merge_pages


@pytest.mark.parametrize("key", ["a", "program-17", "ümlaut", "x" * 300])
def test_partition_for_matches_kafka_default_partitioner(key: str) -> None:
    parts = list(range(8))
    assert partition_for(key, 8) == DefaultPartitioner()(key.encode(), parts, parts)


def test_cursor_roundtrip_and_rejects_garbage() -> None:
    assert decode_cursor(encode_cursor("program/1?x")) == "program/1?x"
    assert decode_cursor(None) is None
    with pytest.raises(ApiError):
        decode_cursor("%%%")


def test_merge_pages_orders_dedupes_and_limits() -> None:
    pages = [{"items": [{"id": "b"}, {"id": "d"}]}, {"items": [{"id": "a"}, {"id": "b"}, {"id": "c"}]}]
    assert [i["id"] for i in merge_pages(pages, key="id", limit=3)] == ["a", "b", "c"]
