"""The validator on the real broker, through its topics: commands in, exact events and
rejections out; malformed input, misrouted records and redelivered dead letters."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from shared import dead_letters as dl
from tests.integration.validator.conftest import Validator
from tests.support.kafka import produce
from tests.support.services import wait_for
from tools import web

pytestmark = pytest.mark.integration

ISSUED = 1_700_000_000_000


def command(
    command_id: str,
    type_: str,
    account_id: str,
    *,
    program_id: str | None = None,
    expected_version: int | None = None,
    data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "command_id": command_id,
        "type": type_,
        "account_id": account_id,
        "program_id": program_id,
        "expected_version": expected_version,
        "data": data or {},
        "issued_at": ISSUED + int(command_id.rsplit("-", 1)[1]),
    }


def send(v: Validator, commands: list[dict[str, Any]]) -> None:
    produce(v.commands, [(c["account_id"], orjson.dumps(c)) for c in commands])


def events_of(v: Validator, account_id: str) -> list[tuple[str, int, str, dict[str, Any]]]:
    return [(e["type"], e["version"], e["command_id"], e["data"]) for e in v.values("account-events", account_id)]


def rejections_of(v: Validator, account_id: str) -> list[tuple[str, str, int | None]]:
    return [(r["command_id"], r["reason"], r["current_version"]) for r in v.values("account-rejections", account_id)]


def scripted(account_id: str) -> list[dict[str, Any]]:
    """create, update, deactivate, stale update, delete, modify after delete, duplicate."""
    a = account_id
    return [
        command(f"{a}-1", "CreateAccount", a, program_id="prog-1", data={"name": "Ann"}),
        command(f"{a}-2", "UpdateAccount", a, expected_version=1, data={"email": "ann@example.com"}),
        command(f"{a}-3", "DeactivateAccount", a, data={"reason": "asked"}),
        command(f"{a}-4", "UpdateAccount", a, expected_version=2, data={"name": "Stale"}),
        command(f"{a}-5", "DeleteAccount", a, expected_version=3),
        command(f"{a}-6", "UpdateAccount", a, data={"name": "Ghost"}),
        command(f"{a}-2", "UpdateAccount", a, expected_version=1, data={"email": "ann@example.com"}),
    ]


def assert_scripted_outcome(v: Validator, a: str) -> None:
    merged = {"name": "Ann", "email": "ann@example.com"}
    assert events_of(v, a) == [
        ("AccountCreated", 1, f"{a}-1", {"name": "Ann"}),
        ("AccountUpdated", 2, f"{a}-2", merged),
        ("AccountDeactivated", 3, f"{a}-3", {"reason": "asked"}),
        ("AccountDeleted", 4, f"{a}-5", {}),
    ]
    assert rejections_of(v, a) == [(f"{a}-4", "VERSION_CONFLICT", 3), (f"{a}-6", "DELETED", 4)]
    events = v.values("account-events", a)
    assert all(e["program_id"] == "prog-1" and e["account_id"] == a for e in events)
    assert [e["occurred_at"] for e in events] == [ISSUED + 1, ISSUED + 2, ISSUED + 3, ISSUED + 5]
    assert len({e["event_id"] for e in events}) == 4


def test_scripted_sequence_in_one_batch(validator: Validator) -> None:
    """All seven commands produced at once: each is decided after the one before it."""
    send(validator, scripted("batch-acct"))
    validator.wait_answers({"batch-acct"}, 6)
    assert_scripted_outcome(validator, "batch-acct")


def test_scripted_sequence_one_command_at_a_time(validator: Validator) -> None:
    a = "step-acct"
    for i, c in enumerate(scripted(a), start=1):
        send(validator, [c])
        validator.wait_answers({a}, min(i, 6))
    assert_scripted_outcome(validator, a)


def test_remaining_transitions(validator: Validator) -> None:
    a, b = "trans-a", "trans-b"
    send(
        validator,
        [
            command("t-1", "UpdateAccount", a),  # NOT_FOUND
            command("t-2", "CreateAccount", a, program_id="prog-2"),  # v1
            command("t-3", "CreateAccount", a, program_id="prog-2"),  # ALREADY_EXISTS
            command("t-4", "ReactivateAccount", a),  # INVALID_TRANSITION (active)
            command("t-5", "DeactivateAccount", a, expected_version=1),  # v2
            command("t-6", "DeactivateAccount", a),  # INVALID_TRANSITION (inactive)
            command("t-7", "ReactivateAccount", a, expected_version=2),  # v3
            command("t-8", "CreateAccount", b),  # INVALID_COMMAND (no program)
            command("t-9", "UpdateAccount", a, program_id="prog-other"),  # INVALID_COMMAND (other program)
            command("t-1", "CreateAccount", a, program_id="prog-2"),  # duplicate of t-1
        ],
    )
    validator.wait_answers({a, b}, 9)
    assert events_of(validator, a) == [
        ("AccountCreated", 1, "t-2", {}),
        ("AccountDeactivated", 2, "t-5", {}),
        ("AccountReactivated", 3, "t-7", {}),
    ]
    assert rejections_of(validator, a) == [
        ("t-1", "NOT_FOUND", None),
        ("t-3", "ALREADY_EXISTS", 1),
        ("t-4", "INVALID_TRANSITION", 1),
        ("t-6", "INVALID_TRANSITION", 2),
        ("t-9", "INVALID_COMMAND", 3),
    ]
    assert rejections_of(validator, b) == [("t-8", "INVALID_COMMAND", None)]


def test_malformed_input_is_rejected_or_dead_lettered_and_the_worker_keeps_going(validator: Validator) -> None:
    a = "mal-acct"
    produce(
        validator.commands,
        [
            (a, b"not json at all"),
            (a, b"[1, 2, 3]"),
            (a, None),
            (a, orjson.dumps({"type": "CreateAccount", "account_id": a, "program_id": "p"})),  # no command_id
            (a, orjson.dumps({"command_id": "m-1", "type": "Explode", "account_id": a})),
            (a, orjson.dumps({"command_id": "m-2", "type": "UpdateAccount", "account_id": a, "expected_version": "x"})),
            (a, orjson.dumps({"command_id": "m-3", "type": "CreateAccount", "account_id": a, "program_id": 7})),
            (a, orjson.dumps(command("m-4", "CreateAccount", a, program_id="prog-m"))),
        ],
    )
    validator.wait_answers({a}, 4)
    assert [(r[0], r[1]) for r in rejections_of(validator, a)] == [
        ("m-1", "INVALID_COMMAND"),
        ("m-2", "INVALID_COMMAND"),
        ("m-3", "INVALID_COMMAND"),
    ]
    assert "Explode" in validator.values("account-rejections", a)[0]["detail"]
    assert events_of(validator, a) == [("AccountCreated", 1, "m-4", {})]

    def letters() -> list[Any] | None:
        found = [r for r in validator.records("dead-letters") if r.key == a.encode()]
        return found if len(found) >= 4 else None

    found = wait_for(letters, timeout=20, message="4 dead letters")
    assert [r.value for r in found] == [
        b"not json at all",
        b"[1, 2, 3]",
        None,
        orjson.dumps({"type": "CreateAccount", "account_id": a, "program_id": "p"}),
    ]
    for r in found:
        headers = dl.headers_dict(r.headers)
        assert headers[dl.ORIGINAL_TOPIC] == validator.commands
        assert headers[dl.RETRY_TOPIC] == validator.topic("retry-validator")
        assert headers[dl.ATTEMPT] == "1"
        assert headers[dl.ERROR_CLASS] in ("DecodeError", "MalformedCommand")
        assert headers[dl.ERROR_MESSAGE]


def test_misrouted_commands_are_decided_where_their_account_lives(validator: Validator) -> None:
    a = "moved-acct"
    produce(validator.commands, [("some-other-key", orjson.dumps(command("mv-1", "CreateAccount", a, program_id="p")))])
    validator.wait_answers({a}, 1)
    produce(validator.commands, [(None, orjson.dumps(command("mv-2", "UpdateAccount", a, expected_version=1)))])
    validator.wait_answers({a}, 2)
    assert events_of(validator, a) == [("AccountCreated", 1, "mv-1", {}), ("AccountUpdated", 2, "mv-2", {})]
    moved = [r for r in validator.records("account-commands") if r.key == a.encode()]
    assert len(moved) == 2, "each misrouted record is re-sent once, keyed by its account_id"


def test_redelivered_commands_are_processed_like_fresh_ones(validator: Validator) -> None:
    a = "retry-acct"
    retry = validator.topic("retry-validator")
    headers = [
        (dl.ID, b"dlq-1"),
        (dl.ORIGINAL_TOPIC, validator.commands.encode()),
        (dl.ATTEMPT, b"1"),
        (dl.RETRY_TOPIC, retry.encode()),
        ("trace", b"abc"),
    ]
    produce(retry, [(a, orjson.dumps(command("rt-1", "CreateAccount", a, program_id="p")))], headers=headers)
    produce(
        retry,
        [(a, b"{still broken")],
        headers=[
            (dl.ID, b"dlq-2"),
            (dl.ORIGINAL_TOPIC, validator.commands.encode()),
            (dl.ATTEMPT, b"2"),
            (dl.FIRST_FAILED_AT, b"123"),
        ],
    )
    validator.wait_answers({a}, 1)
    assert events_of(validator, a) == [("AccountCreated", 1, "rt-1", {})]

    def letter() -> Any:
        return next((r for r in validator.records("dead-letters") if r.key == a.encode()), None)

    again = dl.headers_dict(wait_for(letter, timeout=20, message="the broken redelivery dead-lettered").headers)
    assert again[dl.ID] == "dlq-2" and again[dl.ATTEMPT] == "3" and again[dl.FIRST_FAILED_AT] == "123"
    assert again[dl.ORIGINAL_TOPIC] == validator.commands


def test_a_malformed_account_event_is_dead_lettered_by_each_reader_and_never_listed(validator: Validator) -> None:
    """An AccountCreated without occurred_at, and one with a 300-character account id, on
    account-events (from another producer) and redelivered through retry-validator: dead
    letters (InvalidEvent, parked at once by the retry scheduler), never in the listing."""
    program = "prog-malformed-events"
    events, retry = validator.topic("account-events"), validator.topic("retry-validator")

    def created(account_id: str) -> dict[str, Any]:
        return {
            "event_id": f"e-{account_id[:20]}",
            "command_id": f"c-{account_id[:20]}",
            "type": "AccountCreated",
            "account_id": account_id,
            "program_id": program,
            "version": 1,
            "occurred_at": ISSUED,
            "data": {},
        }

    def untimed(account_id: str) -> bytes:
        return orjson.dumps({k: v for k, v in created(account_id).items() if k != "occurred_at"})

    produce(events, [("mal-ev-untimed", untimed("mal-ev-untimed")), ("mal-ev-long", orjson.dumps(created("L" * 300)))])
    produce(
        retry,
        [("mal-ev-again", untimed("mal-ev-again"))],
        headers=[
            (dl.ID, b"dlq-ev-1"),
            (dl.ORIGINAL_TOPIC, events.encode()),
            (dl.ATTEMPT, b"1"),
            (dl.RETRY_TOPIC, retry.encode()),
        ],
    )
    produce(events, [("mal-ev-fine", orjson.dumps(created("mal-ev-fine")))])

    keys = {b"mal-ev-untimed", b"mal-ev-long", b"mal-ev-again"}

    def letters() -> dict[bytes, dict[str, str]] | None:
        found = {r.key: dl.headers_dict(r.headers) for r in validator.records("dead-letters") if r.key in keys}
        return found if len(found) == len(keys) else None

    found = wait_for(letters, timeout=30, message="the three malformed events dead-lettered")
    for headers in found.values():
        assert headers[dl.ERROR_CLASS] == "InvalidEvent"
        assert headers[dl.ORIGINAL_TOPIC] == events
    assert "'occurred_at' must be an integer" in found[b"mal-ev-untimed"][dl.ERROR_MESSAGE]
    assert "'account_id' is longer than 256 characters" in found[b"mal-ev-long"][dl.ERROR_MESSAGE]
    assert found[b"mal-ev-again"][dl.ID] == "dlq-ev-1" and found[b"mal-ev-again"][dl.ATTEMPT] == "2"

    def listed() -> list[str] | None:
        body = web.get(f"{validator.proc.url}/programs/{program}/accounts", timeout=10).json()
        ids = [item["account_id"] for item in body["items"]]
        return ids if ids else None

    assert wait_for(listed, timeout=30, message="the well-formed event listed") == ["mal-ev-fine"]
