from __future__ import annotations

from typing import Any

import httpx
import pytest

from spark_jobs.tally_compare import LiveServiceError, differences, fetch_live_tallies

pytestmark = pytest.mark.spark


def t(program: str, active: int, inactive: int, last: int | None) -> dict[str, Any]:
    return {"program_id": program, "numberActive": active, "numberInactive": inactive, "lastLogin": last}


def test_differences_name_each_program_and_field() -> None:
    backfill = {"a": t("a", 1, 0, 5), "b": t("b", 2, 1, None), "c": t("c", 0, 0, 9)}
    live = {"a": t("a", 1, 0, 5), "b": t("b", 2, 0, 7), "d": t("d", 1, 0, None)}
    diffs = differences(backfill, live)
    assert [d.describe() for d in diffs] == [
        "b: numberInactive backfill=1 live=0, lastLogin backfill=None live=7",
        "c: only in the backfill {'program_id': 'c', 'numberActive': 0, 'numberInactive': 0, 'lastLogin': 9}",
        "d: only in the live service {'program_id': 'd', 'numberActive': 1, 'numberInactive': 0, 'lastLogin': None}",
    ]
    assert differences(backfill, dict(backfill)) == []


def test_fetch_follows_cursors() -> None:
    pages = {
        None: {"items": [{"program_id": "a", "numberActive": 1, "numberInactive": 0, "lastLogin": None}], "next_cursor": "c1"},
        "c1": {"items": [{"program_id": "b", "numberActive": 0, "numberInactive": 2, "lastLogin": 42}], "next_cursor": None},
    }
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/tallies"
        cursor = request.url.params.get("cursor")
        seen.append((cursor, request.url.params.get("limit")))
        return httpx.Response(200, json=pages[cursor])

    got = fetch_live_tallies("http://svc:8002/", transport=httpx.MockTransport(handler))
    assert got == {"a": t("a", 1, 0, None), "b": t("b", 0, 2, 42)}
    assert seen == [(None, "1000"), ("c1", "1000")]


def test_rows_of_any_projection_compare_by_its_key_field() -> None:
    page = {"items": [{"key": "c1", "open": 1, "shipped": 0, "cancelled": 0, "revenue_cents": 0}], "next_cursor": None}
    transport = httpx.MockTransport(lambda r: httpx.Response(200, json=page))
    live = fetch_live_tallies("http://svc:8002", "key", transport=transport)
    backfill = {"c1": {"key": "c1", "open": 0, "shipped": 1, "cancelled": 0, "revenue_cents": 500}}
    assert [d.describe() for d in differences(backfill, live)] == [
        "c1: open backfill=0 live=1, shipped backfill=1 live=0, revenue_cents backfill=500 live=0"
    ]
    with pytest.raises(LiveServiceError, match="rows without 'program_id'"):
        fetch_live_tallies("http://svc:8002", transport=transport)


def test_fetch_error_says_what_answered() -> None:
    transport = httpx.MockTransport(lambda r: httpx.Response(503, json={"error": "recovering"}))
    with pytest.raises(LiveServiceError, match="answered 503"):
        fetch_live_tallies("http://svc:8002", transport=transport)
