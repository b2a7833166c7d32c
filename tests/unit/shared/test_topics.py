"""Topic names that settings list with or without the topic prefix."""

from __future__ import annotations

from shared.ordered_retries import is_ordered
from shared.topics import configured_name


def test_a_listed_topic_matches_by_its_own_name_or_without_the_prefix() -> None:
    names = {"orders", "staging.payments"}
    assert configured_name("orders", names, "staging.") == "orders"
    assert configured_name("staging.orders", names, "staging.") == "orders"
    assert configured_name("staging.payments", names, "staging.") == "staging.payments"
    assert configured_name("staging.refunds", names, "staging.") is None
    assert configured_name("staging.orders", names) is None  # no prefix configured: names only


def test_ordered_topics_match_the_same_way_and_need_a_key() -> None:
    topics = frozenset({"orders"})
    assert is_ordered(topics, "staging.orders", b"k", "staging.")
    assert not is_ordered(topics, "staging.orders", None, "staging.")
    assert not is_ordered(frozenset(), "orders", b"k")
    assert not is_ordered(topics, "other.orders", b"k", "staging.")
