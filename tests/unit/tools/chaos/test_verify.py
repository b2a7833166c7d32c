"""The chaos run's verifier: silent on a fleet that did everything right, and each loss or
wrong value it is there to find, injected one at a time, makes it fail."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable

import pytest

from tools.chaos.model import dead_letter_fate
from tools.chaos.observe import Observed, Rec
from tools.chaos.plan import Plan, build
from tools.chaos.verify import Report, TopicConfig, verify

TOPICS = TopicConfig(max_attempts=4)
Headers = tuple[tuple[str, bytes], ...]


@pytest.fixture(scope="module")
def plan() -> Plan:
    return build(11, duration_s=30, max_attempts=TOPICS.max_attempts)


def sent_headers(plan: Plan) -> dict[bytes, Headers]:
    return {d.value: (*d.headers, ("dlq.failed.at", b"1700000000000")) if d.dlq_id else d.headers for d in plan.dead_letters}


def perfect(plan: Plan) -> Observed:
    """What a fleet that keeps the contract writes and answers for ``plan``."""
    obs = Observed()
    model = plan.model

    def rec(topic: str, key: bytes | None, value: bytes, headers: Headers = ()) -> Rec:
        return Rec(topic, 0, len(obs.events) + len(obs.rejections) + len(obs.parking_lot), key, value, headers)

    for event in model.all_events():
        body = {
            "event_id": f"{event.command_id}:e",
            "command_id": event.command_id,
            "type": event.type,
            "account_id": event.account_id,
            "program_id": event.program_id,
            "version": event.version,
            "occurred_at": 1,
            "data": {},
        }
        obs.events.append(rec("account-events", event.account_id.encode(), json.dumps(body).encode()))
    for command_id, outcome in model.outcomes.items():
        if outcome.event is not None:
            obs.commands_http[command_id] = {"status": "accepted", "event": {"version": outcome.event.version}}
        else:
            reason = sorted(outcome.reasons)[0]
            obs.commands_http[command_id] = {"status": "rejected", "reason": reason}
            body = {"command_id": command_id, "account_id": outcome.account_id, "reason": reason}
            obs.rejections.append(rec("account-rejections", outcome.account_id.encode(), json.dumps(body).encode()))
    for account_id in model.named_accounts:
        account = model.accounts.get(account_id)
        obs.accounts_http[account_id] = dataclasses.asdict(account) if account is not None else None
    for program, tally in model.tallies().items():
        stale = {**tally, "numberActive": tally["numberActive"] + 1}  # an older tally, overwritten by the next
        obs.tallies += [
            Rec("program-tallies", 0, i, program.encode(), json.dumps(t).encode(), ()) for i, t in enumerate((stale, tally))
        ]
        obs.tallies_http[program] = tally
    obs.retries = {TOPICS.retry: [], "retry-validator": []}
    for i, spec in enumerate(plan.dead_letters):
        headers = sent_headers(plan)[spec.value]
        fate = dead_letter_fate(
            {k: v.decode() for k, v in headers},
            max_attempts=TOPICS.max_attempts,
            default_retry_topic=TOPICS.retry,
            parking_lot=TOPICS.parking_lot,
        )
        added: Headers = () if spec.dlq_id else (("dlq.id", f"derived-{i}".encode()),)
        if "dlq.attempt" not in dict(headers):
            added += (("dlq.attempt", b"1"),)
        copy = Rec(fate.topic, 0, i, spec.key, spec.value, (*headers, *added))
        if fate.parked:
            obs.parking_lot.append(copy)
            if spec.dlq_id:
                obs.parked_http[spec.dlq_id] = {"id": spec.dlq_id, "value_base64": base64.b64encode(spec.value).decode()}
        else:
            obs.retries[fate.topic].append(copy)
    for i, value in enumerate(plan.poison):
        headers = (("dlq.original.topic", TOPICS.account_commands.encode()), ("dlq.attempt", b"1"))
        obs.dead_letters.append(Rec("dead-letters", 0, i, b"k", value, headers))
        obs.parking_lot.append(Rec(TOPICS.parking_lot, 1, i, b"k", value, headers))
    return obs


def check(plan: Plan, obs: Observed) -> Report:
    return verify(plan, sent_headers(plan), obs, TOPICS)


def test_a_fleet_that_keeps_the_contract_passes(plan: Plan) -> None:
    report = check(plan, perfect(plan))
    assert report.problems == []
    assert report.ok
    assert report.events_seen == report.events_expected == len(list(plan.model.all_events())) > 0
    assert report.dead_letters == len(plan.dead_letters) + len(plan.poison)
    assert report.table().splitlines()[0].startswith("| commands | events")


def test_repeats_the_contract_allows_are_counted_not_failed(plan: Plan) -> None:
    obs = perfect(plan)
    obs.events.append(obs.events[3])  # a redone batch writes the same event again
    redelivered = next(records for records in obs.retries.values() if records)
    redelivered.append(redelivered[0])  # a redelivery repeated with its dlq.id and dlq.attempt
    report = check(plan, obs)
    assert report.ok, report.problems
    assert report.duplicates_delivered == 2


def test_under_exactly_once_any_repeat_fails_the_run_and_says_which(plan: Plan) -> None:
    obs = perfect(plan)
    assert verify(plan, sent_headers(plan), obs, TOPICS, exactly_once=True).ok
    obs.events.append(obs.events[3])
    redelivered = next(records for records in obs.retries.values() if records)
    redelivered.append(redelivered[0])
    report = verify(plan, sent_headers(plan), obs, TOPICS, exactly_once=True)
    assert report.settled and not report.ok
    assert report.duplicates_delivered == 2
    assert len(report.problems) == 2
    assert all(p.startswith("duplicates delivered: ") and "seen 2 times read_committed" in p for p in report.problems)


def test_a_tally_published_twice_in_a_row_is_a_repeat_and_one_that_comes_back_later_is_not(plan: Plan) -> None:
    obs = perfect(plan)
    last = obs.tallies[-1]
    obs.tallies.append(dataclasses.replace(last, offset=last.offset + 1))  # the same tally again
    report = verify(plan, sent_headers(plan), obs, TOPICS, exactly_once=True)
    assert report.settled and not report.ok
    assert report.duplicates_delivered == 1 and "tally of" in report.problems[0]
    # Stale, current, stale, current: each differs from the one before it.
    obs = perfect(plan)
    stale, current = obs.tallies[-2], obs.tallies[-1]
    obs.tallies += [dataclasses.replace(stale, offset=stale.offset + 2), dataclasses.replace(current, offset=current.offset + 2)]
    assert verify(plan, sent_headers(plan), obs, TOPICS, exactly_once=True).ok


def _first_event_of_a_later_version(obs: Observed) -> int:
    return next(i for i, r in enumerate(obs.events) if json.loads(r.value or b"")["version"] > 1)


def _edit_json(rec: Rec, **changes: object) -> Rec:
    return dataclasses.replace(rec, value=json.dumps({**json.loads(rec.value or b""), **changes}).encode())


def _drop_event(obs: Observed) -> None:
    del obs.events[_first_event_of_a_later_version(obs)]  # a gap in an account's versions


def _conflicting_event(obs: Observed) -> None:
    obs.events.append(_edit_json(obs.events[0], event_id="another"))


def _wrong_event(obs: Observed) -> None:
    i = _first_event_of_a_later_version(obs)
    obs.events[i] = _edit_json(obs.events[i], type="AccountCreated")


def _repeat_that_differs(obs: Observed) -> None:
    i = _first_event_of_a_later_version(obs)
    obs.events.append(_edit_json(obs.events[i], command_id="someone-else"))  # same event_id, another command


def _extra_event(obs: Observed) -> None:
    obs.events.append(_edit_json(obs.events[0], version=999, event_id="x"))


def _drop_rejection(obs: Observed) -> None:
    del obs.rejections[0]


def _wrong_reason(obs: Observed) -> None:
    obs.rejections[0] = _edit_json(obs.rejections[0], reason="NOT_A_REASON")


def _pending_outcome(obs: Observed) -> None:
    obs.commands_http[next(iter(obs.commands_http))] = {"status": "pending"}


def _outcome_404(obs: Observed) -> None:
    obs.commands_http[next(iter(obs.commands_http))] = None


def _wrong_account(obs: Observed) -> None:
    account = next(k for k, v in obs.accounts_http.items() if isinstance(v, dict))
    obs.accounts_http[account] = {**obs.accounts_http[account], "version": 0}  # type: ignore[dict-item]


def _drop_last_tally(obs: Observed) -> None:
    del obs.tallies[-1]  # the program's latest tally is the stale one


def _wrong_tally_http(obs: Observed) -> None:
    program = next(iter(obs.tallies_http))
    obs.tallies_http[program] = {**obs.tallies_http[program], "lastLogin": 1}  # type: ignore[dict-item]


def _drop_redelivery(obs: Observed) -> None:
    del next(records for records in obs.retries.values() if records)[0]


def _drop_parked(obs: Observed) -> None:
    del obs.parking_lot[0]


def _header_lost(obs: Observed) -> None:
    records = next(records for records in obs.retries.values() if records)
    records[0] = dataclasses.replace(records[0], headers=records[0].headers[1:])


def _parked_redelivered(obs: Observed) -> None:
    obs.retries[TOPICS.retry].append(dataclasses.replace(obs.parking_lot[0], topic=TOPICS.retry))


def _poison_not_dead_lettered(obs: Observed) -> None:
    del obs.dead_letters[0]


def _parked_not_over_http(obs: Observed) -> None:
    obs.parked_http[next(iter(obs.parked_http))] = None


@pytest.mark.parametrize(
    ("inject", "column"),
    [
        (_drop_event, "lost"),
        (_conflicting_event, "wrong"),
        (_wrong_event, "wrong"),
        (_repeat_that_differs, "wrong"),
        (_extra_event, "wrong"),
        (_drop_rejection, "lost"),
        (_wrong_reason, "wrong"),
        (_pending_outcome, "lost"),
        (_outcome_404, "lost"),
        (_wrong_account, "wrong"),
        (_drop_last_tally, "wrong_tallies"),
        (_wrong_tally_http, "wrong_tallies"),
        (_drop_redelivery, "dead_letters_lost"),
        (_drop_parked, "dead_letters_lost"),
        (_header_lost, "wrong"),
        (_parked_redelivered, "wrong"),
        (_poison_not_dead_lettered, "lost"),
        (_parked_not_over_http, "wrong"),
    ],
)
def test_each_loss_or_wrong_value_fails_the_run(plan: Plan, inject: Callable[[Observed], None], column: str) -> None:
    obs = perfect(plan)
    inject(obs)
    report = check(plan, obs)
    assert not report.ok
    assert getattr(report, column) >= 1, report.problems
    assert report.problems
