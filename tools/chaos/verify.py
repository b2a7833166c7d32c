"""Checks what the fleet wrote and answers against the reference model.

Every check counts into one column of the summary: something the model expects and
nobody wrote or answers is *lost*; something written or answered that the model does
not allow is *wrong*; a repeat the contract allows at least once (a redone batch's event, a
redelivery with the same ``dlq.id`` and ``dlq.attempt``) is a *duplicate delivered*, which
fails an exactly_once run.
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tools.chaos.model import DeadLetterFate, dead_letter_fate
from tools.chaos.observe import Observed, Rec
from tools.chaos.plan import Plan


@dataclass(frozen=True)
class TopicConfig:
    account_commands: str = "account-commands"
    retry: str = "retry"
    parking_lot: str = "parking-lot"
    max_attempts: int = 4


@dataclass
class Report:
    commands: int = 0
    events_expected: int = 0
    events_seen: int = 0
    duplicates_delivered: int = 0
    lost: int = 0
    wrong: int = 0
    wrong_tallies: int = 0
    dead_letters: int = 0
    dead_letters_lost: int = 0
    #: Whether the run promised each record once to committed readers.
    exactly_once: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def settled(self) -> bool:
        """Nothing expected is missing or wrong (duplicates aside)."""
        return not (self.lost or self.wrong or self.wrong_tallies or self.dead_letters_lost)

    @property
    def ok(self) -> bool:
        return self.settled and not (self.exactly_once and self.duplicates_delivered)

    def duplicate(self, repeats: int, what: str) -> None:
        """Count ``repeats`` of one record; under exactly_once each is also a problem."""
        self.duplicates_delivered += repeats
        if repeats and self.exactly_once:
            self.problems.append(f"duplicates delivered: {what} seen {repeats + 1} times read_committed")

    def add(self, column: str, problem: str) -> None:
        setattr(self, column, getattr(self, column) + 1)
        self.problems.append(f"{column.replace('_', ' ')}: {problem}")

    def table(self) -> str:
        columns = [
            ("commands", self.commands),
            ("events", f"{self.events_seen}/{self.events_expected}"),
            ("duplicates delivered", self.duplicates_delivered),
            ("lost", self.lost),
            ("wrong", self.wrong),
            ("wrong tallies", self.wrong_tallies),
            ("dead letters", self.dead_letters),
            ("dead letters lost", self.dead_letters_lost),
        ]
        widths = [max(len(name), len(str(value))) for name, value in columns]
        head = " | ".join(name.ljust(w) for (name, _), w in zip(columns, widths, strict=True))
        rule = "-|-".join("-" * w for w in widths)
        row = " | ".join(str(value).rjust(w) for (_, value), w in zip(columns, widths, strict=True))
        return f"| {head} |\n|-{rule}-|\n| {row} |"


def _json(value: bytes | None) -> dict[str, Any] | None:
    try:
        parsed = json.loads(value or b"")
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _header(headers: Sequence[tuple[str, bytes]], name: str) -> str | None:
    return next((v.decode(errors="replace") for k, v in headers if k == name), None)


def _headers_kept(sent: Sequence[tuple[str, bytes]], got: Sequence[tuple[str, bytes]]) -> bool:
    """Every header sent is there with its value, in the order sent (others may be added)."""
    it = iter(got)
    return all(any(h == g for g in it) for h in sent)


def verify(
    plan: Plan,
    dead_letter_headers: dict[bytes, tuple[tuple[str, bytes], ...]],
    observed: Observed,
    topics: TopicConfig,
    *,
    exactly_once: bool = False,
) -> Report:
    report = Report(commands=plan.commands, exactly_once=exactly_once)
    _check_events(plan, observed, report)
    _check_outcomes(plan, observed, report)
    _check_tallies(plan, observed, report)
    _check_dead_letters(plan, dead_letter_headers, observed, topics, report)
    _check_poison(plan, observed, topics, report)
    return report


def _check_events(plan: Plan, observed: Observed, report: Report) -> None:
    model = plan.model
    seen: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for rec in observed.events:
        event = _json(rec.value)
        if event is None or not isinstance(event.get("account_id"), str) or not isinstance(event.get("version"), int):
            report.add("wrong", f"account-events {rec.partition}@{rec.offset} is not an event: {rec.value!r:.120}")
            continue
        if rec.key != event["account_id"].encode():
            report.add("wrong", f"event {event.get('event_id')!r} keyed {rec.key!r}, not by its account")
        seen[(event["account_id"], event["version"])].append(event)
    expected = {(e.account_id, e.version): e for e in model.all_events()}
    report.events_expected = len(expected)
    for (account, version), copies in sorted(seen.items()):
        ids = {c.get("event_id") for c in copies}
        if len(ids) > 1:
            report.add("wrong", f"{len(ids)} different events for ({account!r}, version {version}): {sorted(map(str, ids))}")
        report.duplicate(len(copies) - 1, f"event ({account!r}, v{version})")
        want = expected.get((account, version))
        if want is None:
            report.add("wrong", f"an event the model does not expect: {copies[0]}")
            continue
        report.events_seen += 1
        for got in copies:  # a repeat too must be the same event
            got_fields = (got.get("type"), got.get("command_id"), got.get("program_id"))
            if got_fields != (want.type, want.command_id, want.program_id):
                report.add(
                    "wrong",
                    f"event ({account!r}, v{version}) is {got_fields}, the model says "
                    f"{(want.type, want.command_id, want.program_id)}",
                )
                break
    for key, want in sorted(expected.items()):
        if key not in seen:
            report.add("lost", f"no event ({want.account_id!r}, v{want.version}) {want.type} of {want.command_id!r}")


def _check_outcomes(plan: Plan, observed: Observed, report: Report) -> None:
    model = plan.model
    rejections: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in observed.rejections:
        rejection = _json(rec.value)
        if rejection is None or not isinstance(rejection.get("command_id"), str):
            report.add("wrong", f"account-rejections {rec.partition}@{rec.offset} is not a rejection: {rec.value!r:.120}")
            continue
        rejections[rejection["command_id"]].append(rejection)
    for command_id in sorted(set(rejections) - set(model.outcomes)):
        report.add("wrong", f"a rejection of a command the load never sent: {rejections[command_id][0]}")
    for command_id, outcome in sorted(model.outcomes.items()):
        written = rejections.get(command_id, [])
        if outcome.accepted and written:
            report.add("wrong", f"{command_id!r} is accepted (model) but rejected on the topic: {written[0]}")
        if not outcome.accepted:
            if not written:
                report.add("lost", f"no rejection of {command_id!r} on account-rejections ({sorted(outcome.reasons)})")
            for r in written:
                if r.get("reason") not in outcome.reasons:
                    report.add(
                        "wrong", f"{command_id!r} rejected {r.get('reason')!r}, the model allows {sorted(outcome.reasons)}"
                    )
                    break
        answer = observed.commands_http.get(command_id, "not asked")
        if not isinstance(answer, dict) or answer.get("status") not in ("accepted", "rejected"):
            shown = answer.get("status") if isinstance(answer, dict) else answer
            report.add("lost", f"GET /commands/{command_id}: no outcome ({shown})")
            continue
        if outcome.event is not None:
            event = answer.get("event") or {}
            if answer["status"] != "accepted" or event.get("version") != outcome.event.version:
                report.add(
                    "wrong",
                    f"GET /commands/{command_id}: {answer['status']} {answer.get('reason')} "
                    f"v{event.get('version')}, the model says accepted v{outcome.event.version}",
                )
        elif answer["status"] != "rejected" or answer.get("reason") not in outcome.reasons:
            report.add(
                "wrong",
                f"GET /commands/{command_id}: {answer['status']} {answer.get('reason')}, "
                f"the model says rejected {sorted(outcome.reasons)}",
            )
    for account_id in sorted(model.named_accounts):
        want = model.accounts.get(account_id)
        answer = observed.accounts_http.get(account_id, "not asked")
        if want is None:
            if answer is not None:
                report.add("wrong", f"GET /accounts/{account_id}: {answer}, the model says 404")
            continue
        expected = {"account_id": account_id, "program_id": want.program_id, "status": want.status, "version": want.version}
        got = {k: answer.get(k) for k in expected} if isinstance(answer, dict) else answer
        if got != expected:
            report.add("wrong", f"GET /accounts/{account_id}: {got}, the model says {expected}")


_TALLY_FIELDS = ("program_id", "numberActive", "numberInactive", "lastLogin")


def _check_tallies(plan: Plan, observed: Observed, report: Report) -> None:
    expected = plan.model.tallies()
    latest: dict[str, Rec] = {}
    for rec in observed.tallies:  # sorted by partition and offset: the last record of a key wins
        program = (rec.key or b"").decode(errors="replace")
        before = latest.get(program)
        if before is not None and before.value == rec.value:
            # The same tally again, with no other between: a repeat (a program's tallies change
            # one record at a time, so a value may come back later, but never twice in a row).
            report.duplicate(1, f"tally of {program!r} {rec.value!r}")
        latest[program] = rec
    wrong: set[str] = set()
    for program in sorted(set(latest) - set(expected)):
        wrong.add(program)
        report.problems.append(f"wrong tallies: a tally on program-tallies for a program the load never named: {program!r}")
    for program, want in sorted(expected.items()):
        last = latest.get(program)
        tally = _json(last.value) if last is not None else None
        got = {k: tally.get(k) for k in _TALLY_FIELDS} if tally is not None else None
        if got != want:
            wrong.add(program)
            report.problems.append(f"wrong tallies: program-tallies has {got} for {program!r}, the model says {want}")
        answer = observed.tallies_http.get(program, "not asked")
        got_http = {k: answer.get(k) for k in _TALLY_FIELDS} if isinstance(answer, dict) else answer
        if got_http != want:
            wrong.add(program)
            report.problems.append(f"wrong tallies: GET /tallies/{program} is {got_http}, the model says {want}")
    report.wrong_tallies = len(wrong)


def _check_dead_letters(
    plan: Plan, sent_headers: dict[bytes, tuple[tuple[str, bytes], ...]], observed: Observed, topics: TopicConfig, report: Report
) -> None:
    by_value: dict[str, dict[bytes, list[Rec]]] = defaultdict(lambda: defaultdict(list))
    for topic, records in [*observed.retries.items(), (topics.parking_lot, observed.parking_lot)]:
        for rec in records:
            by_value[topic][rec.value or b""].append(rec)
    report.dead_letters += len(plan.dead_letters)
    for spec in plan.dead_letters:
        name = spec.dlq_id or f"(no dlq.id) {spec.value!r:.48}"
        headers = sent_headers.get(spec.value)
        if headers is None:
            report.add("dead_letters_lost", f"{name}: the load never sent it")
            continue
        fate: DeadLetterFate = dead_letter_fate(
            {k: v.decode() for k, v in headers},
            max_attempts=topics.max_attempts,
            default_retry_topic=topics.retry,
            parking_lot=topics.parking_lot,
        )
        copies = by_value[fate.topic].get(spec.value, [])
        elsewhere = [t for t in by_value if t != fate.topic and spec.value in by_value[t]]
        if elsewhere:
            report.add("wrong", f"{name} went to {elsewhere}; the model says {'parked' if fate.parked else fate.topic}")
        if not copies:
            report.add("dead_letters_lost", f"{name} is not on {fate.topic} (attempt {fate.attempt})")
            continue
        ids = {_header(c.headers, "dlq.id") for c in copies}
        attempts = {_header(c.headers, "dlq.attempt") for c in copies}
        report.duplicate(len(copies) - 1, f"{name} on {fate.topic}")
        first = copies[0]
        if first.key != spec.key or not _headers_kept(headers, first.headers):
            report.add(
                "wrong",
                f"{name} on {fate.topic} lost its key or headers: key {first.key!r}, "
                f"headers {first.headers}, sent {spec.key!r}, {headers}",
            )
        if attempts != {str(fate.attempt)} or None in ids or (spec.dlq_id is not None and ids != {spec.dlq_id}):
            report.add(
                "wrong",
                f"{name} on {fate.topic} carries dlq.id {ids} and dlq.attempt {attempts}, "
                f"expected {spec.dlq_id or 'a derived id'} and {fate.attempt}",
            )
        if fate.parked and spec.dlq_id is not None:
            answer = observed.parked_http.get(spec.dlq_id, "not asked")
            value_ok = isinstance(answer, dict) and answer.get("value_base64") == base64.b64encode(spec.value).decode()
            if not isinstance(answer, dict) or answer.get("id") != spec.dlq_id or not value_ok:
                report.add("wrong", f"GET /parked/{spec.dlq_id}: {answer!r:.200}, expected the parked message")


def _check_poison(plan: Plan, observed: Observed, topics: TopicConfig, report: Report) -> None:
    dead = {rec.value for rec in observed.dead_letters if _header(rec.headers, "dlq.original.topic") == topics.account_commands}
    fated = {rec.value for records in observed.retries.values() for rec in records}
    fated |= {rec.value for rec in observed.parking_lot}
    report.dead_letters += len(plan.poison)
    for value in plan.poison:
        if value not in dead:
            report.add("lost", f"poison command {value!r:.60} is not on dead-letters")
        elif value not in fated:
            report.add("dead_letters_lost", f"the dead letter of poison command {value!r:.60} was neither redelivered nor parked")
