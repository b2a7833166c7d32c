"""The validator's handlers on the in-memory topology driver, without a broker: commands become
events or rejections, optimistic concurrency, idempotency by command id and by input offset,
commands decided in order within one batch, reroutes, dead letters, outcomes, command batches,
redelivered dead letters and the program listings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from services.validator.app import ValidatorService
from services.validator.command_batch import BATCH_ID_HEADER, BATCH_INDEX_HEADER
from services.validator.handlers.program_listings import ProgramListings
from services.validator.outcome_records import ACCEPTED, PENDING, REJECTED
from shared import codecs, dead_letters
from shared.domain import ALREADY_EXISTS, INVALID_COMMAND, NOT_FOUND, VERSION_CONFLICT
from shared.engine import partition_for
from shared.engine.testing import TopologyDriver
from shared.settings import Settings

PARTITIONS = 4


def listings(validator: Validator) -> ProgramListings:
    found = validator.service.program_listings
    assert found is not None
    return found


class Validator:
    """The validator's topology on a driver, with its topics' records decoded."""

    def __init__(self, service: ValidatorService, driver: TopologyDriver) -> None:
        self.service = service
        self.driver = driver
        self.topics = service.own_topics

    def command(self, type_: str, command_id: str, account_id: str = "a1", **fields: Any) -> bytes:
        return codecs.dumps(
            {
                "command_id": command_id,
                "account_id": account_id,
                "type": type_,
                "program_id": "p1",
                "data": {"name": "n"},
                **fields,
            }
        )

    def send_command(self, type_: str, command_id: str, account_id: str = "a1", **fields: Any) -> None:
        """Queue a command on its account's partition (handed over at the next process)."""
        self.driver.send(self.topics.commands, account_id.encode(), self.command(type_, command_id, account_id, **fields))

    def pipe_command(self, type_: str, command_id: str, account_id: str = "a1", **fields: Any) -> None:
        self.send_command(type_, command_id, account_id, **fields)
        self.driver.process()

    def account(self, account_id: str) -> SimpleNamespace | None:
        """The account's row: its status, version and data."""
        aggregate = self.service.commands.aggregate(account_id)
        if aggregate is None:
            return None
        return SimpleNamespace(status=aggregate.state.status, version=aggregate.version, data=aggregate.state.data)

    def values(self, topic: str) -> list[dict[str, Any]]:
        return [codecs.loads_object(record.value) for record in self.driver.outputs(topic)]

    def events(self) -> list[dict[str, Any]]:
        return self.values(self.topics.events)

    def rejections(self) -> list[dict[str, Any]]:
        return self.values(self.topics.rejections)

    def outcome(self, command_id: str) -> dict[str, Any] | None:
        raw = self.service.outcomes.outcome(command_id)
        return codecs.loads_object(raw) if raw is not None else None

    def dead_letter_headers(self) -> list[dict[str, str]]:
        return [dead_letters.headers_dict(r.headers) for r in self.driver.outputs(self.topics.dead_letters)]


@pytest.fixture
def validator(tmp_path: Path) -> Iterator[Validator]:
    service = ValidatorService(Settings(data_dir=tmp_path, topic_partitions=PARTITIONS))
    with TopologyDriver(service.engine) as driver:
        yield Validator(service, driver)


# -- commands: events, rejections, state --------------------------------------------------------


def test_a_create_becomes_an_event_an_accepted_outcome_and_the_account_row(validator: Validator) -> None:
    validator.pipe_command("CreateAccount", "c1")
    [event] = validator.events()
    assert (event["type"], event["account_id"], event["version"], event["command_id"]) == ("AccountCreated", "a1", 1, "c1")
    assert validator.rejections() == []
    account = validator.account("a1")
    assert account is not None and (account.status, account.version, account.data) == ("active", 1, {"name": "n"})
    outcome = validator.outcome("c1")
    assert outcome is not None and outcome["status"] == ACCEPTED and outcome["event"] == event


def test_the_event_goes_out_keyed_by_its_account_and_the_row_only_after_it(validator: Validator) -> None:
    validator.pipe_command("CreateAccount", "c1")
    [record] = validator.driver.outputs(validator.topics.events)
    assert record.key == b"a1" and record.partition == partition_for(b"a1", PARTITIONS)
    appended = validator.driver.topics.appended
    changelog = validator.driver.table("accounts").table.changelog
    first_row = next(i for i, r in enumerate(appended) if r.topic == changelog and r.key == b"a1")
    assert appended.index(record) < first_row


def test_a_wrong_expected_version_is_rejected_with_the_current_version(validator: Validator) -> None:
    validator.pipe_command("CreateAccount", "c1")
    validator.pipe_command("UpdateAccount", "c2", expected_version=0, data={"name": "m"})
    [rejection] = validator.rejections()
    assert (rejection["reason"], rejection["command_id"], rejection["current_version"]) == (VERSION_CONFLICT, "c2", 1)
    assert len(validator.events()) == 1
    account = validator.account("a1")
    assert account is not None and (account.version, account.data) == (1, {"name": "n"})
    outcome = validator.outcome("c2")
    assert outcome is not None and outcome["status"] == REJECTED and outcome["rejection"] == rejection


def test_the_right_expected_version_is_accepted(validator: Validator) -> None:
    validator.pipe_command("CreateAccount", "c1")
    validator.pipe_command("UpdateAccount", "c2", expected_version=1, data={"name": "m"})
    assert [(e["type"], e["version"]) for e in validator.events()] == [("AccountCreated", 1), ("AccountUpdated", 2)]
    account = validator.account("a1")
    assert account is not None and (account.version, account.data) == (2, {"name": "m"})


def test_a_command_id_seen_before_is_answered_once(validator: Validator) -> None:
    validator.pipe_command("CreateAccount", "c1")
    validator.pipe_command("CreateAccount", "c1")
    assert len(validator.events()) == 1
    assert validator.rejections() == []  # not ALREADY_EXISTS: the same command, answered before
    assert [r.key for r in validator.driver.outputs(validator.topics.outcomes)] == [b"c1"]


def test_a_new_command_id_for_an_existing_account_is_rejected(validator: Validator) -> None:
    validator.pipe_command("CreateAccount", "c1")
    validator.pipe_command("CreateAccount", "c2")
    assert [r["reason"] for r in validator.rejections()] == [ALREADY_EXISTS]


def test_records_handed_over_again_are_dropped_below_the_stored_next_offset(validator: Validator) -> None:
    validator.pipe_command("CreateAccount", "c1")
    validator.pipe_command("UpdateAccount", "c2", data={"name": "m"})
    partition = partition_for(b"a1", PARTITIONS)
    assert validator.driver.table("accounts").next_offset(validator.topics.commands, partition) == 2
    sent_before = len(validator.driver.topics.appended)
    validator.driver.rewind(validator.topics.commands, partition, 0)
    assert validator.driver.process() == []  # every record a replay: no batch, nothing committed
    assert len(validator.driver.topics.appended) == sent_before


def test_commands_of_one_batch_are_decided_each_against_the_one_before(validator: Validator) -> None:
    validator.send_command("CreateAccount", "c1")
    validator.send_command("UpdateAccount", "c2", expected_version=1, data={"name": "m"})
    validator.send_command("DeactivateAccount", "c3", expected_version=2)
    validator.send_command("UpdateAccount", "c4", expected_version=1)
    batches = validator.driver.process()
    commands = [b for b in batches if b.topic == validator.topics.commands]
    assert [len(b.records) for b in commands] == [4]  # one batch of four
    assert [(e["type"], e["version"]) for e in validator.events()] == [
        ("AccountCreated", 1),
        ("AccountUpdated", 2),
        ("AccountDeactivated", 3),
    ]
    assert [(r["command_id"], r["reason"]) for r in validator.rejections()] == [("c4", VERSION_CONFLICT)]
    # One row per account per batch, its last state.
    rows = [r for r in validator.driver.changelog("accounts") if r.key == b"a1"]
    assert len(rows) == 1 and codecs.loads_object(rows[0].value)["v"] == 3


def test_an_update_of_an_account_never_created_is_not_found(validator: Validator) -> None:
    validator.pipe_command("UpdateAccount", "c1", account_id="ghost")
    assert [r["reason"] for r in validator.rejections()] == [NOT_FOUND]
    assert validator.account("ghost") is None


def test_an_invalid_command_is_rejected_as_invalid_command(validator: Validator) -> None:
    validator.pipe_command("RenameAccount", "c1")
    [rejection] = validator.rejections()
    assert rejection["reason"] == INVALID_COMMAND and "RenameAccount" in rejection["detail"]


def test_a_record_that_is_no_command_is_a_dead_letter(validator: Validator) -> None:
    validator.driver.pipe(validator.topics.commands, b"a1", b"not json", partition=1)
    [headers] = validator.dead_letter_headers()
    assert headers[dead_letters.ORIGINAL_TOPIC] == validator.topics.commands
    assert headers[dead_letters.ORIGINAL_PARTITION] == "1" and headers[dead_letters.ORIGINAL_OFFSET] == "0"
    assert headers[dead_letters.RETRY_TOPIC] == validator.topics.retry
    assert validator.events() == [] and validator.rejections() == []
    # The record is behind the handler all the same: the next offset moved past it.
    assert validator.driver.table("accounts").next_offset(validator.topics.commands, 1) == 1


def test_a_command_on_another_partition_is_moved_to_its_accounts_and_decided_there(validator: Validator) -> None:
    home = partition_for(b"a1", PARTITIONS)
    elsewhere = (home + 1) % PARTITIONS
    validator.driver.pipe(validator.topics.commands, None, validator.command("CreateAccount", "c1"), partition=elsewhere)
    commands = validator.driver.outputs(validator.topics.commands)
    assert [(r.partition, r.key) for r in commands] == [(elsewhere, None), (home, b"a1")]
    assert commands[1].value == commands[0].value
    [event] = validator.events()
    assert event["command_id"] == "c1"
    assert validator.driver.table("accounts").next_offset(validator.topics.commands, elsewhere) == 1


def test_a_submitted_command_is_pending_until_decided_and_pending_never_replaces_the_answer(validator: Validator) -> None:
    command = codecs.loads_object(validator.command("CreateAccount", "c1"))
    validator.driver.run(validator.service.commands.submit(command))
    outcomes = validator.driver.outputs(validator.topics.outcomes)
    assert [codecs.loads_object(r.value)["status"] for r in outcomes] == [PENDING]
    assert validator.outcome("c1") is None  # sent, not yet handed over

    validator.driver.process()
    outcome = validator.outcome("c1")
    assert outcome is not None and outcome["status"] == ACCEPTED

    # A late "pending" (a resent POST) does not hide the answer.
    validator.driver.run(validator.service.commands.submit(command))
    validator.driver.process()
    outcome = validator.outcome("c1")
    assert outcome is not None and outcome["status"] == ACCEPTED


def test_an_outcome_waited_for_is_read_once_its_records_are_applied(validator: Validator) -> None:
    validator.send_command("CreateAccount", "c1")
    validator.driver.process()
    found = validator.driver.run(validator.service.outcomes.outcome_once_applied("c1"))
    assert found is not None and codecs.loads_object(found)["status"] == ACCEPTED


# -- the program listings ---------------------------------------------------------------------


def test_events_reach_their_programs_listing_through_the_second_hop(validator: Validator) -> None:
    validator.pipe_command("CreateAccount", "c1", account_id="a1")
    validator.pipe_command("CreateAccount", "c2", account_id="a2")
    validator.pipe_command("DeactivateAccount", "c3", account_id="a1")
    routed = validator.driver.outputs(validator.topics.by_program)
    assert {r.key for r in routed} == {b"p1"} and {r.partition for r in routed} == {partition_for(b"p1", PARTITIONS)}
    listed, more = listings(validator).list_program("p1", limit=10, before=None, status=None)
    assert not more
    assert {(item.account_id, item.status) for item in listed} == {("a1", "inactive"), ("a2", "active")}


def test_an_event_that_breaks_the_event_shape_is_a_dead_letter_and_never_listed(validator: Validator) -> None:
    event = {
        "event_id": "e1",
        "command_id": "c1",
        "type": "AccountCreated",
        "account_id": "a1",
        "program_id": "p1",
        "version": 1,
        "data": {},
    }  # no occurred_at
    validator.driver.pipe(validator.topics.events, b"a1", codecs.dumps(event))
    [headers] = validator.dead_letter_headers()
    assert headers[dead_letters.ORIGINAL_TOPIC] == validator.topics.events
    assert headers[dead_letters.ERROR_CLASS] == "InvalidEvent"
    assert validator.driver.outputs(validator.topics.by_program) == []
    assert listings(validator).list_program("p1", limit=10, before=None, status=None) == ([], False)


# -- redelivered dead letters -----------------------------------------------------------------


def test_a_redelivered_command_goes_back_to_its_accounts_partition_with_its_headers(validator: Validator) -> None:
    headers = [(dead_letters.ORIGINAL_TOPIC, validator.topics.commands.encode()), (dead_letters.ATTEMPT, b"2")]
    validator.driver.pipe(validator.topics.retry, b"a1", validator.command("CreateAccount", "c1"), headers=headers)
    commands = validator.driver.outputs(validator.topics.commands)
    assert [(r.partition, r.key, r.headers) for r in commands] == [(partition_for(b"a1", PARTITIONS), b"a1", headers)]
    assert [e["command_id"] for e in validator.events()] == ["c1"]


def test_a_redelivered_record_still_unreadable_is_a_dead_letter_again(validator: Validator) -> None:
    validator.driver.pipe(
        validator.topics.retry, b"a1", b"{", headers=[(dead_letters.ORIGINAL_TOPIC, validator.topics.commands.encode())]
    )
    [headers] = validator.dead_letter_headers()
    assert headers[dead_letters.ORIGINAL_TOPIC] == validator.topics.retry
    assert validator.driver.outputs(validator.topics.commands) == []


# -- command batches ----------------------------------------------------------------------------


def batch(batch_id: str, *items: Any) -> bytes:
    return codecs.dumps({"batch_id": batch_id, "commands": list(items)})


def pipe_batch(validator: Validator, value: bytes, batch_id: str = "b1") -> None:
    key = batch_id.encode()
    validator.driver.pipe(validator.topics.command_batches, key, value, partition=partition_for(key, PARTITIONS))


def test_a_command_batch_is_split_into_commands_each_decided_and_recorded(validator: Validator) -> None:
    pipe_batch(
        validator,
        batch(
            "b1",
            {"command_id": "c1", "account_id": "a1", "type": "CreateAccount", "program_id": "p1"},
            {"account_id": "a2", "type": "CreateAccount", "program_id": "p1"},
            {"command_id": "c3", "account_id": "a1", "type": "UpdateAccount", "expected_version": 7},
        ),
    )
    commands = validator.driver.outputs(validator.topics.commands)
    assert [dead_letters.headers_dict(r.headers) for r in commands] == [
        {BATCH_ID_HEADER: "b1", BATCH_INDEX_HEADER: str(i)} for i in range(3)
    ]
    assert [codecs.loads_object(r.value)["command_id"] for r in commands] == ["c1", "b1:1", "c3"]
    summary = validator.service.command_batches.batch_summary("b1")
    assert summary is not None
    ids, outcomes = summary
    assert ids == ["c1", "b1:1", "c3"]
    assert {i: (o["status"], o["reason"]) for i, o in outcomes.items()} == {
        0: (ACCEPTED, None),
        1: (ACCEPTED, None),
        2: (REJECTED, VERSION_CONFLICT),
    }


def test_a_resent_batch_sends_only_the_items_not_decided_yet(validator: Validator) -> None:
    value = batch("b1", {"command_id": "c1", "account_id": "a1", "type": "CreateAccount", "program_id": "p1"})
    pipe_batch(validator, value)
    sent = len(validator.driver.outputs(validator.topics.commands))
    pipe_batch(validator, value)
    assert len(validator.driver.outputs(validator.topics.commands)) == sent
    assert len(validator.events()) == 1


def test_a_batch_item_that_is_no_object_is_rejected_by_the_splitter_and_dead_lettered(validator: Validator) -> None:
    pipe_batch(
        validator,
        batch("b1", "not an object", {"command_id": "c1", "account_id": "a1", "type": "CreateAccount", "program_id": "p1"}),
    )
    [headers] = validator.dead_letter_headers()
    assert headers[dead_letters.ERROR_CLASS] == "MalformedBatch"
    assert [codecs.loads_object(r.value)["command_id"] for r in validator.driver.outputs(validator.topics.commands)] == ["c1"]
    summary = validator.service.command_batches.batch_summary("b1")
    assert summary is not None
    assert {i: (o["status"], o["reason"]) for i, o in summary[1].items()} == {0: (REJECTED, INVALID_COMMAND), 1: (ACCEPTED, None)}


def test_a_record_that_is_no_batch_is_a_dead_letter(validator: Validator) -> None:
    pipe_batch(validator, codecs.dumps({"batch_id": "b1", "commands": []}))
    [headers] = validator.dead_letter_headers()
    assert headers[dead_letters.ERROR_CLASS] == "MalformedBatch"
    assert validator.service.command_batches.batch_summary("b1") is None
