"""The input every system of the peers benchmark gets, and the tallies it must produce.

The records are those of the tallies benchmark (:func:`tools.bench.tallies.generate`):
account histories on ``account-events`` and a quarter of them as logins on ``logins``,
both keyed by account. Optionally a fraction of the account events is sent a second time,
later than the original (same key, so the same partition, after the newer versions): a
replay that must change nothing, so a topology without the version check gets it wrong.

The expected tallies are computed from the records themselves by :func:`reference_tallies`,
a plain fold written apart from ``services/tallies/domain.py``; with no replays they must
equal what the generator knows by construction, which :func:`build` checks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import orjson

from tools.bench.tallies import generate

Records = list[tuple[bytes, bytes]]

STATUS_AFTER = {
    "AccountCreated": "active",
    "AccountDeactivated": "inactive",
    "AccountReactivated": "active",
    "AccountDeleted": "deleted",
}


@dataclass(frozen=True)
class Workload:
    events: Records
    logins: Records
    replays: int
    #: program_id -> its Tally JSON, as the contract writes it on ``program-tallies``.
    expected: dict[str, dict[str, Any]]

    @property
    def records(self) -> int:
        return len(self.events) + len(self.logins)


def with_replays(events: Records, count: int, rng: random.Random) -> Records:
    """``events`` with ``count`` of them sent again, each at a random place after its original."""
    placed = [(float(i), record) for i, record in enumerate(events)]
    for _ in range(count):
        i = rng.randrange(len(events))
        placed.append((rng.uniform(i + 0.5, len(events)), events[i]))
    placed.sort(key=lambda item: item[0])
    return [record for _, record in placed]


def tally(program_id: str, active: int, inactive: int, last_login: int | None) -> dict[str, Any]:
    return {"program_id": program_id, "numberActive": active, "numberInactive": inactive, "lastLogin": last_login}


def reference_tallies(events: Records, logins: Records) -> dict[str, dict[str, Any]]:
    """Every program's tally after ``events`` and ``logins`` in the order given (per account,
    the order of its partition): the newest version of each account decides its status."""
    accounts: dict[str, tuple[int, str, str]] = {}  # account -> (version, status, program)
    for _, raw in events:
        event = orjson.loads(raw)
        account, version = event["account_id"], event["version"]
        current = accounts.get(account)
        if current is not None and version <= current[0]:
            continue
        if event["type"] == "AccountUpdated":
            status = current[1] if current is not None else "unknown"
        else:
            status = STATUS_AFTER[event["type"]]
        accounts[account] = (version, status, event["program_id"])
    counts: dict[str, list[int]] = {}
    for _, status, program in accounts.values():
        row = counts.setdefault(program, [0, 0])
        row[0] += status == "active"
        row[1] += status == "inactive"
    last: dict[str, int] = {}
    for _, raw in logins:
        login = orjson.loads(raw)
        program, ts = login["program_id"], login["ts"]
        if program not in last or ts > last[program]:
            last[program] = ts
    programs = sorted(set(counts) | set(last))
    return {p: tally(p, counts.get(p, [0, 0])[0], counts.get(p, [0, 0])[1], last.get(p)) for p in programs}


def build(records: int, programs: int, replay_fraction: float = 0.0, seed: int = 42) -> Workload:
    """``records`` input records in all: account events, replays of some of them, logins."""
    if not 0.0 <= replay_fraction < 1.0:
        raise ValueError(f"replay fraction must be in [0, 1), got {replay_fraction}")
    replays = round(records * replay_fraction)
    events, logins, by_construction = generate(records - replays, programs, seed)
    if replays:
        events = with_replays(events, replays, random.Random(seed + 1))
    expected = reference_tallies(events, logins)
    if not replays:
        constructed = {p: tally(p, a, i, None if last < 0 else last) for p, (a, i, last) in by_construction.items()}
        if constructed != expected:
            raise AssertionError("the reference fold and the generator disagree on the expected tallies")
    return Workload(events=events, logins=logins, replays=replays, expected=expected)
