"""Merging list pages from several partitions and instances, and the retry cursor."""

from __future__ import annotations

import pytest

from services.retry_scheduler.routes.pages import (
    decode_retry_cursor,
    merge_pages,
    parked_sort,
    retry_cursor,
    retry_frontier,
    retry_sort,
)
from services.retry_scheduler.state import due_key
from shared.http.pagination import InvalidCursor


def item(due: int, dlq_id: str) -> dict[str, object]:
    return {"due_at": due, "id": dlq_id}


def test_pages_merge_in_due_order_up_to_the_limit_without_duplicates() -> None:
    pages: list[dict[str, object]] = [
        {"items": [item(5, "a"), item(9, "c")], "frontier": None},
        {"items": [item(1, "z"), item(5, "b"), item(5, "a")], "frontier": None},
    ]
    items, frontier = merge_pages(pages, 3, retry_sort, retry_frontier)
    assert [(i["due_at"], i["id"]) for i in items] == [(1, "z"), (5, "a"), (5, "b")]
    assert frontier is None


def test_a_page_that_ran_out_of_budget_holds_back_items_past_its_frontier() -> None:
    pages: list[dict[str, object]] = [
        {"items": [item(1, "a"), item(8, "late")], "frontier": None},
        {"items": [], "frontier": [5, "m"]},  # examined everything up to (5, "m"), found nothing
    ]
    items, frontier = merge_pages(pages, 10, retry_sort, retry_frontier)
    assert [i["id"] for i in items] == ["a"] and frontier == (5, "m")


def test_parked_pages_merge_by_id() -> None:
    pages: list[dict[str, object]] = [
        {"items": [{"id": "b"}, {"id": "d"}]},
        {"items": [{"id": "a"}, {"id": "c"}], "frontier": "c"},
    ]
    items, frontier = merge_pages(pages, 10, parked_sort, str)
    assert [i["id"] for i in items] == ["a", "b", "c"] and frontier == "c"


def test_retry_cursor_round_trips_to_the_due_key() -> None:
    assert decode_retry_cursor(retry_cursor(123, "id:with:colons")) == due_key(123, "id:with:colons")
    assert decode_retry_cursor(None) is None


@pytest.mark.parametrize("text", ["bm8tY29sb24", "YWJjOmlk", "LTE6aWQ", "OTk5OTk5OTk5OTk5OTk5OTk5OTk6aWQ", "%%%"])
def test_cursors_this_api_did_not_make_are_refused(text: str) -> None:
    with pytest.raises(InvalidCursor):
        decode_retry_cursor(text)
