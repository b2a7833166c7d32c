from __future__ import annotations

import base64

import pytest
from aiokafka.partitioner import DefaultPartitioner

from shared.engine import partition_for
from shared.http.pagination import InvalidCursor, decode_cursor, encode_cursor, merge_pages


@pytest.mark.parametrize("key", ["a", "program-17", "ümlaut", "x" * 300])
def test_partition_for_matches_kafka_default_partitioner(key: str) -> None:
    parts = list(range(8))
    assert partition_for(key, 8) == DefaultPartitioner()(key.encode(), parts, parts)


def test_cursor_roundtrip_and_rejects_garbage() -> None:
    assert decode_cursor(encode_cursor("program/1?x", "tallies"), "tallies") == "program/1?x"
    assert decode_cursor(encode_cursor("with\x00nul", "parked"), "parked") == "with\x00nul"
    assert decode_cursor(None, "tallies") is None
    with pytest.raises(InvalidCursor):
        decode_cursor("%%%", "tallies")


@pytest.mark.parametrize(
    "cursor",
    [
        base64.urlsafe_b64encode(b"not-a-cursor").decode(),  # any base64 text
        base64.urlsafe_b64encode(b"tallies\x00program-1").decode(),  # well-formed but without the check
        encode_cursor("program-1", "tallies")[:-2],  # truncated
        encode_cursor("program-1", "tallies")[:-1] + ("A" if encode_cursor("program-1", "tallies")[-1] != "A" else "B"),
        encode_cursor("program-1", "parked"),  # another list's
    ],
)
def test_every_list_refuses_cursors_it_did_not_make(cursor: str) -> None:
    with pytest.raises(InvalidCursor):
        decode_cursor(cursor, "tallies")


def test_merge_pages_orders_dedupes_and_limits() -> None:
    pages = [{"items": [{"id": "b"}, {"id": "d"}]}, {"items": [{"id": "a"}, {"id": "b"}, {"id": "c"}]}]
    assert [i["id"] for i in merge_pages(pages, key="id", limit=3)] == ["a", "b", "c"]
