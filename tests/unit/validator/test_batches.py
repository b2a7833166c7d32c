"""Splitting a batch: the envelope, the items' command ids, what each item's outcome keeps."""

from __future__ import annotations

import pytest

from services.validator.command_batch import MalformedBatch, batch_item, item_command_id, parse_batch
from services.validator.outcome_records import batch_item_outcome
from services.validator.state import batch_item_index, batch_item_key, batch_item_prefix, batch_manifest_key
from shared.domain import MAX_ID_LENGTH, Duplicate


def test_a_batch_keeps_its_items_as_they_are_and_names_each_one() -> None:
    batch = parse_batch({"batch_id": "b1", "commands": [{"command_id": "own"}, {"type": "x"}, 42]}, max_commands=10)
    assert batch.items == ({"command_id": "own"}, {"type": "x"}, 42)
    assert batch.command_ids() == ["own", "b1:1", "b1:2"]
    # The same batch resent names its items the same again.
    assert (
        parse_batch({"batch_id": "b1", "commands": [{"command_id": "own"}, {"type": "x"}, 42]}, max_commands=10).command_ids()
        == batch.command_ids()
    )
    assert batch_item("b1", 1, {"type": "x"}) == {"type": "x", "command_id": "b1:1"}


@pytest.mark.parametrize("bad_id", ["", 7, None, "a\x00b", "x" * (MAX_ID_LENGTH + 1)])
def test_an_item_without_a_usable_command_id_gets_one_from_the_batch(bad_id: object) -> None:
    assert item_command_id("b", 3, {"command_id": bad_id}) == "b:3"


def test_a_derived_command_id_is_never_longer_than_an_id_may_be() -> None:
    assert len(item_command_id("b" * MAX_ID_LENGTH, 999, {})) <= MAX_ID_LENGTH


@pytest.mark.parametrize(
    "obj, problem",
    [
        ({"commands": [{}]}, "batch_id"),
        ({"batch_id": "b", "commands": []}, "non-empty list"),
        ({"batch_id": "b", "commands": {"a": 1}}, "non-empty list"),
        ({"batch_id": "b", "commands": [{}] * 4}, "at most 3"),
    ],
)
def test_what_is_not_a_batch_is_refused_whole(obj: dict[str, object], problem: str) -> None:
    with pytest.raises(MalformedBatch, match=problem):
        parse_batch(obj, max_commands=3)


def test_an_item_answered_before_keeps_its_first_answer() -> None:
    assert batch_item_outcome("c", Duplicate("c", "a", 4))["status"] == "accepted"
    rejected = batch_item_outcome("c", Duplicate("c", "a", "VERSION_CONFLICT"))
    assert (rejected["status"], rejected["reason"]) == ("rejected", "VERSION_CONFLICT")
    unreadable = batch_item_outcome("c", None, "not a JSON object")
    assert (unreadable["status"], unreadable["reason"]) == ("rejected", "INVALID_COMMAND")
    assert unreadable["detail"] == "not a JSON object"


def test_a_batch_keeps_its_items_in_order_after_its_manifest() -> None:
    keys = sorted([batch_item_key("b", 300), batch_item_key("b", 2), batch_manifest_key("b"), batch_item_key("b", 10)])
    prefix = batch_item_prefix("b")
    assert [batch_item_index(k, prefix) for k in keys if k.startswith(prefix)] == [2, 10, 300]
    assert not batch_item_key("b", 0).startswith(batch_item_prefix("b2"))
