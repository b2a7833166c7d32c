"""JSON on the wire: UTF-8, compact, integers for timestamps.

Topics are consumed as raw bytes and decoded here, inside the handler, so that a
message that is not JSON becomes a dead letter instead of an exception in Faust's
deserializer.
"""

from __future__ import annotations

from typing import Any

import orjson


class DecodeError(ValueError):
    """The bytes are not the JSON object the message type requires."""


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)


def loads(data: bytes | str | None) -> Any:
    if data is None:
        raise DecodeError("message has no value")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"not valid JSON: {exc}") from exc


def loads_object(data: bytes | str | None) -> dict[str, Any]:
    value = loads(data)
    if not isinstance(value, dict):
        raise DecodeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def encode_key(key: str | bytes | None) -> bytes | None:
    if key is None or isinstance(key, bytes):
        return key
    return key.encode()


def decode_key(key: bytes | str | None) -> str | None:
    if key is None or isinstance(key, str):
        return key
    return key.decode("utf-8", errors="replace")
