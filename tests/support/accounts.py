"""Generated account histories with the tallies they must produce, known by construction."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import orjson

#: The topics of the bundled accounts domain and its tallies (without the prefix): the chart's own.
ACCOUNT_TOPICS = (
    "account-commands",
    "account-command-batches",
    "account-events",
    "account-rejections",
    "logins",
    "program-tallies",
)

LIFECYCLES: dict[str, tuple[list[str], str]] = {
    "active": (["AccountCreated", "AccountUpdated"], "active"),
    "inactive": (["AccountCreated", "AccountDeactivated"], "inactive"),
    "reactivated": (["AccountCreated", "AccountDeactivated", "AccountReactivated"], "active"),
    "deleted": (["AccountCreated", "AccountDeactivated", "AccountDeleted"], "deleted"),
    "deleted_active": (["AccountCreated", "AccountUpdated", "AccountDeleted"], "deleted"),
}


def event(account_id: str, program_id: str, type_: str, version: int) -> dict[str, Any]:
    return {
        "event_id": f"{account_id}:{version}",
        "command_id": f"cmd-{account_id}-{version}",
        "type": type_,
        "account_id": account_id,
        "program_id": program_id,
        "version": version,
        "occurred_at": 1_700_000_000_000 + version,
        "data": {},
    }


def create_command(account_id: str, program_id: str, command_id: str, issued_at: int, name: str) -> dict[str, Any]:
    """A CreateAccount command as clients POST it to the validator's /commands."""
    return {
        "command_id": command_id,
        "type": "CreateAccount",
        "account_id": account_id,
        "program_id": program_id,
        "issued_at": issued_at,
        "data": {"name": name},
    }


@dataclass
class History:
    events: list[tuple[str, bytes]] = field(default_factory=list)
    logins: list[tuple[str, bytes]] = field(default_factory=list)
    expected: dict[str, dict[str, Any]] = field(default_factory=dict)


def generate(programs: int, accounts_per_program: int, seed: int = 1, logins_per_program: int = 3) -> History:
    rng = random.Random(seed)
    history = History()
    per_account: list[list[tuple[str, bytes]]] = []
    for p in range(programs):
        program = f"program-{p}"
        active = inactive = 0
        for a in range(accounts_per_program):
            account = f"{program}-acct-{a}"
            kind = rng.choice(list(LIFECYCLES))
            types, final = LIFECYCLES[kind]
            active += final == "active"
            inactive += final == "inactive"
            per_account.append([(account, orjson.dumps(event(account, program, t, v))) for v, t in enumerate(types, start=1)])
        last_login = None
        for _ in range(logins_per_program):
            ts = rng.randrange(1_700_000_000_000, 1_800_000_000_000)
            last_login = ts if last_login is None else max(last_login, ts)
            account = f"{program}-acct-{rng.randrange(accounts_per_program)}"
            history.logins.append((account, orjson.dumps({"account_id": account, "program_id": program, "ts": ts})))
        history.expected[program] = {
            "program_id": program,
            "numberActive": active,
            "numberInactive": inactive,
            "lastLogin": last_login,
        }
    # Interleave accounts while keeping each account's events in order, as a real topic does.
    cursors = [0] * len(per_account)
    live = list(range(len(per_account)))
    while live:
        i = rng.choice(live)
        history.events.append(per_account[i][cursors[i]])
        cursors[i] += 1
        if cursors[i] == len(per_account[i]):
            live.remove(i)
    return history
