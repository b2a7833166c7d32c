"""Merging list pages from several partitions and instances, and the cursor of GET /retries."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.retry_scheduler.domain import MAX_DUE_MS
from services.retry_scheduler.state import due_key
from shared.http.pagination import InvalidCursor, decode_cursor, encode_cursor


def merge_pages(pages: list[dict[str, Any]], limit: int, sort_key: Any, frontier_key: Any) -> tuple[list[dict[str, Any]], Any]:
    """The first ``limit`` items of all pages in order, none past the lowest frontier.

    A page's frontier says it stopped early (its scan budget ran out) having examined
    everything up to there; items of other pages beyond it must wait for the next page.
    """
    frontiers = [frontier_key(p["frontier"]) for p in pages if p.get("frontier") is not None]
    frontier = min(frontiers) if frontiers else None
    seen: dict[Any, dict[str, Any]] = {}
    for page in pages:
        for item in page.get("items", []):
            k = sort_key(item)
            if frontier is None or k <= frontier:
                seen.setdefault(k, item)
    items = [seen[k] for k in sorted(seen)[:limit]]
    return items, frontier


def cursor_after(
    items: list[dict[str, Any]], limit: int, frontier: Any, sort_key: Any, encode: Callable[[Any], str]
) -> str | None:
    """After a full page, resume past its last item; after a short one, at the frontier."""
    if len(items) == limit:
        return encode(sort_key(items[-1]))
    return encode(frontier) if frontier is not None else None


def retry_sort(item: dict[str, Any]) -> tuple[int, str]:
    return int(item["due_at"]), str(item["id"])


def retry_frontier(f: Any) -> tuple[int, str]:
    return int(f[0]), str(f[1])


def parked_sort(item: dict[str, Any]) -> str:
    return str(item["id"])


def retry_cursor(due_at: int, dlq_id: str) -> str:
    return encode_cursor(f"{due_at}:{dlq_id}", "retries")


def decode_retry_cursor(cursor: str | None) -> bytes | None:
    text = decode_cursor(cursor, "retries")
    if text is None:
        return None
    due, sep, dlq_id = text.partition(":")
    if not sep or not due.isdigit() or int(due) > MAX_DUE_MS:
        raise InvalidCursor("cursor is not one this API returned")
    return due_key(int(due), dlq_id)
