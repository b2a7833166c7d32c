"""What the wire can carry, checked where input enters the API.

Messages are written with orjson, which cannot encode an integer beyond 64 bits, a
string holding a lone UTF-16 surrogate, or nesting deeper than 254 levels; Kafka keys
are UTF-8 too, and other consumers (Spark, Java) read integers as signed 64-bit longs.
Python's JSON parser accepts all of these, so a request carrying one would fail only
once something was already written. The API models refuse them up front (422) with
these types and :func:`check_json`.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, Field

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: Deepest nesting of objects and arrays taken in free-form JSON (orjson stops at 254).
MAX_JSON_DEPTH = 64

#: An integer every consumer of the fleet's messages can read (a signed 64-bit long).
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
#: A non-negative one, for versions and epoch-ms timestamps.
NonNegativeInt64 = Annotated[int, Field(ge=0, le=INT64_MAX)]


def has_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone UTF-16 surrogate (``"\\ud800"`` in JSON), which has no UTF-8 form."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_text(value: str) -> str:
    if has_surrogate(value):
        raise ValueError("must be valid Unicode text (no lone surrogate such as \\ud800)")
    return value


def check_json(value: Any, *, path: str = "", depth: int = 0) -> Any:
    """``value`` unchanged if it can be written as a message, else ValueError naming where it cannot."""
    where = path or "the value"
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"{where}: nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValueError(f"{where}: integer {value} is outside the signed 64-bit range")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value} is not a finite number")
        return value
    if isinstance(value, str):
        if has_surrogate(value):
            raise ValueError(f"{where}: text holds a lone surrogate, which has no UTF-8 form")
        return value
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str) or has_surrogate(k):
                raise ValueError(f"{where}: key {k!r:.40} is not valid Unicode text")
            check_json(v, path=f"{path}.{k}" if path else k, depth=depth + 1)
        return value
    if isinstance(value, list):
        for i, v in enumerate(value):
            check_json(v, path=f"{path}[{i}]", depth=depth + 1)
        return value
    raise ValueError(f"{where}: {type(value).__name__} is not a JSON value")


#: Text that can be written to Kafka as UTF-8.
Text = Annotated[str, AfterValidator(check_text)]
#: A free-form JSON object that can be written as a message.
JsonObject = Annotated[dict[str, Any], AfterValidator(check_json)]
