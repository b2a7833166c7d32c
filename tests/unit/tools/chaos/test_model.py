"""The chaos run's reference model: the contract's rules, one command at a time."""

from __future__ import annotations

from typing import Any

from tools.chaos.model import Model, dead_letter_fate
from tools.chaos.plan import CommandStep, RecordStep, build


def cmd(
    command_id: str, type_: str, account: str = "a", expected: int | None = None, program: str | None = "p"
) -> dict[str, Any]:
    return {
        "command_id": command_id,
        "type": type_,
        "account_id": account,
        "program_id": program,
        "expected_version": expected,
        "data": {},
        "issued_at": 1,
    }


def test_a_lifecycle_gives_versions_one_by_one_and_the_tallies_follow_the_status() -> None:
    model = Model()
    assert model.apply(cmd("c1", "CreateAccount")).event is not None
    assert model.apply(cmd("c2", "DeactivateAccount", expected=1)).accepted
    assert model.tallies()["p"] == {"program_id": "p", "numberActive": 0, "numberInactive": 1, "lastLogin": None}
    assert model.apply(cmd("c3", "ReactivateAccount")).accepted
    model.login("p", 5)
    model.login("p", 3)
    assert model.tallies()["p"] == {"program_id": "p", "numberActive": 1, "numberInactive": 0, "lastLogin": 5}
    deleted = model.apply(cmd("c4", "DeleteAccount", expected=3))
    assert deleted.event is not None and (deleted.event.version, deleted.event.type) == (4, "AccountDeleted")
    assert [e.version for e in model.events["a"]] == [1, 2, 3, 4]
    assert model.tallies()["p"]["numberActive"] == 0


def test_rejections_name_every_reason_the_contract_allows() -> None:
    model = Model()
    assert model.apply(cmd("c0", "UpdateAccount")).reasons == {"NOT_FOUND"}
    model.apply(cmd("c1", "CreateAccount"))
    assert model.apply(cmd("c2", "CreateAccount")).reasons == {"ALREADY_EXISTS"}
    assert model.apply(cmd("c3", "ReactivateAccount")).reasons == {"INVALID_TRANSITION"}
    assert model.apply(cmd("c4", "UpdateAccount", expected=7)).reasons == {"VERSION_CONFLICT"}
    # Both stale and invalid: the contract does not say which reason wins.
    assert model.apply(cmd("c5", "ReactivateAccount", expected=7)).reasons == {"INVALID_TRANSITION", "VERSION_CONFLICT"}
    model.apply(cmd("c6", "DeleteAccount"))
    assert model.apply(cmd("c7", "UpdateAccount")).reasons == {"DELETED"}
    assert model.apply(cmd("c8", "DeactivateAccount")).reasons == {"DELETED", "INVALID_TRANSITION"}
    assert model.apply(cmd("c9", "CreateAccount")).reasons == {"ALREADY_EXISTS", "DELETED"}
    assert model.accounts["a"].version == 2


def test_a_command_id_seen_before_gives_the_same_outcome_and_no_new_event() -> None:
    model = Model()
    first = model.apply(cmd("c1", "CreateAccount"))
    model.apply(cmd("c2", "UpdateAccount"))
    assert model.apply(cmd("c1", "CreateAccount")) == first
    assert [e.version for e in model.events["a"]] == [1, 2]
    rejected = model.apply(cmd("c3", "ReactivateAccount"))
    model.apply(cmd("c4", "DeactivateAccount"))
    assert model.apply(cmd("c3", "ReactivateAccount")) == rejected  # not accepted now that it would be


def test_dead_letter_fates_follow_the_attempt_and_the_defaults() -> None:
    def fate(**headers: str) -> tuple[bool, str, int]:
        f = dead_letter_fate(headers, max_attempts=4, default_retry_topic="retry", parking_lot="parking-lot")
        return f.parked, f.topic, f.attempt

    assert fate() == (False, "retry", 1)
    assert fate(**{"dlq.attempt": "3", "dlq.retry.topic": "retry-x"}) == (False, "retry-x", 3)
    assert fate(**{"dlq.attempt": "4"}) == (True, "parking-lot", 4)
    assert fate(**{"dlq.error.class": "DecodeError"}) == (True, "parking-lot", 1)


def test_the_plan_is_the_same_for_a_seed_and_holds_every_kind_of_input() -> None:
    one, again, other = (build(s, duration_s=30, max_attempts=4) for s in (3, 3, 4))
    assert one.chains == again.chains and one.chains != other.chains
    steps = [s for chain in one.chains for s in chain]
    commands = [s for s in steps if isinstance(s, CommandStep)]
    assert {s.channel for s in commands} == {"http", "kafka"}
    assert any(s.duplicate for s in commands)
    assert {s.kind for s in steps if isinstance(s, RecordStep)} == {"poison", "login", "dead_letter"}
    reasons = {r for o in one.model.outcomes.values() for r in o.reasons}
    assert {"VERSION_CONFLICT", "INVALID_TRANSITION", "NOT_FOUND"} <= reasons
    fates = {
        dead_letter_fate(
            {k: v.decode() for k, v in d.headers}, max_attempts=4, default_retry_topic="retry", parking_lot="parking-lot"
        ).parked
        for d in one.dead_letters
    }
    assert fates == {True, False}
    assert any(d.dlq_id is None for d in one.dead_letters) and any(d.dlq_id for d in one.dead_letters)
    # Each command id belongs to one account, and every poison value and dead letter is unique.
    assert len({s.command["command_id"] for s in commands}) == len(one.model.outcomes)
    assert len(set(one.poison)) == len(one.poison)
    assert len({d.value for d in one.dead_letters}) == len(one.dead_letters)
