"""RocksDB encodings, the program listing's key order, and the HTTP command model."""

from __future__ import annotations

import pydantic
import pytest

from services.validator.domain import ACCOUNTS, COMMAND_TYPES, Account, CommandIn, CommandType
from services.validator.listing import Listing, apply_to_listing
from services.validator.outcome_records import outcome_record, pending_record
from services.validator.state import (
    decode_listing,
    decode_state,
    encode_listing,
    encode_state,
    expired,
    expiry_key,
    listing_cursor,
    listing_key,
    listing_key_from_cursor,
    outcome_status,
    pack_ts,
    program_prefix,
    split_expiry_key,
    unpack_ts,
)
from shared import codecs
from shared.accounts import AccountChange
from shared.domain import Command, Row, plan_batch
from shared.engine._faust import FAUST_OFFSET_KEY


def test_state_round_trips_with_history_order() -> None:
    commands = [
        Command("c1", "a1", "CreateAccount", fields={"program_id": "p1"}, data={"n": 1}, issued_at=1),
        Command("c2", "a1", "DeactivateAccount", expected_version=9, issued_at=2),
        Command("c3", "a1", "DeactivateAccount", issued_at=3),
    ]
    state = plan_batch(ACCOUNTS, commands, lambda _: None, history_limit=10).states["a1"]
    back = decode_state(ACCOUNTS, "a1", encode_state(ACCOUNTS, state))
    assert back == state
    assert list(back.history.items()) == [("c1", 1), ("c2", "VERSION_CONFLICT"), ("c3", 2)]


def test_rows_written_before_the_domain_api_are_read_as_accounts() -> None:
    raw = codecs.dumps({"s": "inactive", "v": 4, "p": "p1", "d": {"n": 1}, "h": [["c1", 1], ["c2", "NOT_FOUND"]]})
    row = decode_state(ACCOUNTS, "a1", raw)
    assert row.aggregate is not None and (row.aggregate.version, row.aggregate.state) == (4, Account("p1", "inactive", {"n": 1}))
    assert row.history == {"c1": 1, "c2": "NOT_FOUND"}
    never = decode_state(ACCOUNTS, "a2", codecs.dumps({"s": None, "v": 0, "p": None, "d": {}, "h": [["u", "NOT_FOUND"]]}))
    assert never.aggregate is None and never.history == {"u": "NOT_FOUND"}
    # written back in the current layout
    assert codecs.loads_object(encode_state(ACCOUNTS, row))["a"] == {"program_id": "p1", "status": "inactive", "data": {"n": 1}}


def test_state_of_an_id_that_never_existed() -> None:
    state: Row[object] = Row(aggregate=None, history={"u": "NOT_FOUND"})
    assert decode_state(ACCOUNTS, "a", encode_state(ACCOUNTS, state)) == state


def test_outcome_records() -> None:
    plan = plan_batch(ACCOUNTS, [Command("c1", "a1", "UpdateAccount", issued_at=1)], lambda _: None, history_limit=10)
    outcome = plan.outcomes[0]
    assert not isinstance(outcome, type(None))
    record = outcome_record(ACCOUNTS, outcome, at=7)  # type: ignore[arg-type]
    assert record["status"] == "rejected" and record["rejection"]["reason"] == "NOT_FOUND" and record["event"] is None
    assert outcome_status(codecs.dumps(record)) == "rejected"
    assert outcome_status(codecs.dumps(pending_record(ACCOUNTS, "c1", "a1", at=1))) == "pending"


@pytest.mark.parametrize("ts", [-(2**70), -5, 0, 1, 1_700_000_000_000, 2**70])
def test_packed_timestamps_sort_like_integers(ts: int) -> None:
    clamped = max(min(ts, 2**63 - 1), -(2**63))
    assert unpack_ts(pack_ts(ts)) == clamped
    assert pack_ts(ts - 1) <= pack_ts(ts) <= pack_ts(ts + 1)


def test_listing_keys_sort_by_creation_then_account_within_a_program() -> None:
    keys = [
        listing_key("p", 5, "b"),
        listing_key("p", 5, "a"),
        listing_key("p", -1, "z"),
        listing_key("p", 10**13, "a"),
        listing_key("pq", 0, "a"),
        listing_key("o", 10**13, "a"),
    ]
    in_p = sorted(k for k in keys if k.startswith(program_prefix("p")))
    assert in_p == [listing_key("p", -1, "z"), listing_key("p", 5, "a"), listing_key("p", 5, "b"), listing_key("p", 10**13, "a")]
    assert not FAUST_OFFSET_KEY.startswith(program_prefix("p"))
    assert max(in_p) < program_prefix("p") + b"\xff" * 9


def test_listing_round_trip_and_cursor() -> None:
    item = Listing("acc", "p", "inactive", 3, 100, 200)
    assert decode_listing("p", encode_listing(item)) == item
    assert listing_key_from_cursor("p", listing_cursor(item)) == listing_key("p", 100, "acc")
    for bad in ("", "x", "12", "abc\x00d"):
        with pytest.raises(ValueError):
            listing_key_from_cursor("p", bad)


def test_listing_follows_versions_and_ignores_replays() -> None:
    created = apply_to_listing(None, AccountChange("a", "p", "AccountCreated", 1, 100))
    assert created == Listing("a", "p", "active", 1, 100, 100)
    updated = apply_to_listing(created, AccountChange("a", "p", "AccountUpdated", 2, 150))
    assert updated == Listing("a", "p", "active", 2, 100, 150)
    off = apply_to_listing(updated, AccountChange("a", "p", "AccountDeactivated", 3, 160))
    assert off == Listing("a", "p", "inactive", 3, 100, 160)
    assert apply_to_listing(off, AccountChange("a", "p", "AccountUpdated", 2, 150)) is None
    assert apply_to_listing(off, AccountChange("a", "p", "AccountDeactivated", 3, 160)) is None
    gone = apply_to_listing(off, AccountChange("a", "p", "AccountDeleted", 4, 170))
    assert gone is not None and gone.status == "deleted"


def test_http_command_model_matches_the_domain() -> None:
    assert set(CommandType.__args__) == set(COMMAND_TYPES)  # type: ignore[attr-defined]
    ok = CommandIn.model_validate({"type": "UpdateAccount", "account_id": "a", "expected_version": 2})
    assert ok.command_id is None and ok.data == {} and ok.expected_version == 2


@pytest.mark.parametrize(
    "body",
    [
        {"type": "Explode", "account_id": "a"},
        {"type": "UpdateAccount"},
        {"type": "UpdateAccount", "account_id": ""},
        {"type": "UpdateAccount", "account_id": 5},
        {"type": "UpdateAccount", "account_id": "a", "expected_version": "2"},
        {"type": "UpdateAccount", "account_id": "a", "expected_version": -1},
        {"type": "UpdateAccount", "account_id": "a", "data": []},
        {"type": "UpdateAccount", "account_id": "a", "expectedVersion": 2},
        {"type": "UpdateAccount", "account_id": "a\x00"},
        {"type": "UpdateAccount", "account_id": "a" * 300},
    ],
)
def test_http_command_model_refuses_bad_bodies(body: dict[str, object]) -> None:
    with pytest.raises(pydantic.ValidationError):
        CommandIn.model_validate(body)


def test_expiry_keys_sort_by_time_before_every_command_id_and_split_back() -> None:
    keys = [expiry_key(t, cid) for t, cid in [(5_000, b"b"), (-1, b"z"), (5_000, b"a"), (10**12, b"c")]]
    assert [split_expiry_key(k) for k in sorted(keys)] == [(-1, b"z"), (5_000, b"a"), (5_000, b"b"), (10**12, b"c")]
    # Command ids cannot contain NUL, so every one sorts after every expiry row.
    assert all(k < b"\x01" for k in keys)


def test_expired_takes_due_rows_oldest_first_up_to_the_limit() -> None:
    index = sorted(expiry_key(t, f"cmd-{t}".encode()) for t in (100, 200, 300, 400))
    rows = [*index, b"\x00next-offset\x00topic", b"cmd-100", b"cmd-200"]
    assert [cid for _, cid in expired(rows, now=250, limit=10)] == [b"cmd-100", b"cmd-200"]
    assert [cid for _, cid in expired(rows, now=10_000, limit=3)] == [b"cmd-100", b"cmd-200", b"cmd-300"]
    assert [cid for _, cid in expired(rows, now=10_000, limit=10)] == [b"cmd-100", b"cmd-200", b"cmd-300", b"cmd-400"]
    assert expired(rows, now=99, limit=10) == []
    assert expired([b"cmd-1"], now=10_000, limit=10) == []
