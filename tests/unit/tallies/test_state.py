from __future__ import annotations

from services.tallies.domain import Membership
from services.tallies.state import ProgramCounts, decode_membership, encode_membership, membership_key, split_membership_key
from shared.accounts import ACTIVE, DELETED, INACTIVE


def test_membership_roundtrip() -> None:
    m = Membership(INACTIVE, 42)
    assert decode_membership(encode_membership(m)) == m
    assert split_membership_key(membership_key("prog", "acc:1")) == ("prog", "acc:1")


def test_rebuild_counts_from_rows() -> None:
    rows = [
        (membership_key("P", "a"), encode_membership(Membership(ACTIVE, 1))),
        (membership_key("P", "b"), encode_membership(Membership(INACTIVE, 2))),
        (membership_key("P", "c"), encode_membership(Membership(DELETED, 3))),
        (membership_key("Q", "d"), encode_membership(Membership(ACTIVE, 1))),
    ]
    counts = ProgramCounts()
    assert counts.rebuild({3: rows}) == 4
    assert counts.get(3, "P") == (1, 1)
    assert counts.get(3, "Q") == (1, 0)
    assert counts.get(2, "P") is None


def test_move_applies_deltas() -> None:
    counts = ProgramCounts()
    counts.move(0, "P", None, ACTIVE)
    counts.move(0, "P", None, ACTIVE)
    counts.move(0, "P", ACTIVE, INACTIVE)
    counts.move(0, "P", INACTIVE, DELETED)
    assert counts.get(0, "P") == (1, 0)
