"""What the API models let through must be writable as a message."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from shared.http.bounds import INT64_MAX, INT64_MIN, MAX_JSON_DEPTH, check_json, check_text


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("value", [{"a": INT64_MAX, "b": INT64_MIN, "c": [1.5, None, True, "é"]}, nested(MAX_JSON_DEPTH), {}])
def test_writable_values_pass_unchanged(value: Any) -> None:
    assert check_json(value) is value
    orjson.dumps(value)


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({"a": INT64_MAX + 1}, "a"),
        ({"a": [0, INT64_MIN - 1]}, r"a\[1\]"),
        ({"a": {"b": 2**70}}, "a.b"),
        ({"s": "\ud800"}, "s"),
        ({"\udfff": 1}, "key"),
        ({"f": float("nan")}, "f"),
        ({"f": float("inf")}, "f"),
        (nested(MAX_JSON_DEPTH + 1), "nested deeper"),
    ],
)
def test_unwritable_values_are_refused_naming_where(value: Any, where: str) -> None:
    with pytest.raises(ValueError, match=where):
        check_json(value)


def test_text_with_a_lone_surrogate_is_refused() -> None:
    assert check_text("ok ✓") == "ok ✓"
    with pytest.raises(ValueError, match="surrogate"):
        check_text("a\ud800b")
