"""Cursor pagination over lists gathered from several instances.

Lists are ordered by a unique key; the cursor is the last key of the page, encoded.
It stays valid across pages and across rebalances because it names a position in
the key order, not an offset into one instance's list.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from shared.http.errors import ApiError


class InvalidCursor(ApiError):
    status = 400
    code = "invalid_cursor"


def encode_cursor(last_key: str) -> str:
    return base64.urlsafe_b64encode(last_key.encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> str | None:
    if not cursor:
        return None
    try:
        return base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise InvalidCursor("cursor is not one this API returned") from exc


def merge_pages(pages: list[dict[str, Any]], *, key: str, limit: int, reverse: bool = False) -> list[dict[str, Any]]:
    """The first ``limit`` items of all pages together, in key order, without duplicates."""
    seen: dict[Any, dict[str, Any]] = {}
    for page in pages:
        for item in page.get("items", []):
            seen.setdefault(item[key], item)
    return [seen[k] for k in sorted(seen, reverse=reverse)][:limit]
