"""Cursor pagination over lists gathered from several instances.

Lists are ordered by a unique key; the cursor is the last key of the page, encoded.
It stays valid across pages and across rebalances because it names a position in
the key order, not an offset into one instance's list.

Every list follows one rule: a cursor names the list it came from and carries a
checksum, so a cursor this API did not make (any base64 string, one from another
list, a truncated one) is refused with 400 ``invalid_cursor`` instead of being read
as some position.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Annotated, Any

from fastapi import Query

from shared.http.errors import ApiError

#: Longest cursor taken: the key after the longest id (1024 characters of up to 4 UTF-8
#: bytes), encoded, fits; the whole request line stays within what the HTTP server reads.
MAX_CURSOR_LENGTH = 6144
_CHECK_BYTES = 6

# The alphabet is documented, not enforced here: anything that is not a cursor this API
# made gets the same 400 invalid_cursor, whatever is wrong with it.
CursorParam = Annotated[
    str | None,
    Query(
        max_length=MAX_CURSOR_LENGTH,
        json_schema_extra={"pattern": "^[A-Za-z0-9_-]*$"},
        description="next_cursor of the previous page",
    ),
]


class InvalidCursor(ApiError):
    status = 400
    code = "invalid_cursor"


def _check(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=_CHECK_BYTES).digest()


def encode_cursor(last_key: str, list_name: str) -> str:
    """The cursor after ``last_key`` in the list ``list_name``."""
    payload = list_name.encode() + b"\x00" + last_key.encode()
    return base64.urlsafe_b64encode(_check(payload) + payload).decode().rstrip("=")


def decode_cursor(cursor: str | None, list_name: str) -> str | None:
    """The key ``cursor`` names in ``list_name``; :class:`InvalidCursor` unless :func:`encode_cursor` made it for that list."""
    if not cursor:
        return None
    try:
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidCursor("cursor is not one this API returned") from exc
    check, payload = raw[:_CHECK_BYTES], raw[_CHECK_BYTES:]
    name, sep, key = payload.partition(b"\x00")
    if len(check) != _CHECK_BYTES or check != _check(payload) or not sep:
        raise InvalidCursor("cursor is not one this API returned")
    if name != list_name.encode():
        raise InvalidCursor(f"cursor belongs to another list, not to {list_name}")
    try:
        return key.decode()
    except UnicodeDecodeError as exc:
        raise InvalidCursor("cursor is not one this API returned") from exc


def merge_pages(pages: list[dict[str, Any]], *, key: str, limit: int, reverse: bool = False) -> list[dict[str, Any]]:
    """The first ``limit`` items of all pages together, in key order, without duplicates."""
    seen: dict[Any, dict[str, Any]] = {}
    for page in pages:
        for item in page.get("items", []):
            seen.setdefault(item[key], item)
    return [seen[k] for k in sorted(seen, reverse=reverse)][:limit]
