"""The validator on a data dir kept from topics since deleted and created again: it discards
that state and serves the accounts of the topics there are now, never an account of the old
ones (docs/contract.md, "Local state"; the tallies' cases are in tests/e2e/tallies/test_state_identity.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.e2e.tallies.test_state_identity import DISCARDED, discarded, log_of, recreate
from tests.support.kafka import BOOTSTRAP, produce
from tests.support.services import ServiceProcess, wait_for
from tools import web

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ENV = {"STATEFLEET_BULK_RESTORE_MIN_LAG": "1"}


def create(account: str, world: str) -> tuple[str, bytes]:
    body: dict[str, Any] = {
        "command_id": f"{world}-{account}",
        "type": "CreateAccount",
        "account_id": account,
        "program_id": f"program-{world}",
        "issued_at": 1_700_000_000_000,
        "data": {},
    }
    return account, orjson.dumps(body)


def account(proc: ServiceProcess, account_id: str) -> dict[str, Any] | None:
    got = web.get(f"{proc.url}/accounts/{account_id}", timeout=5)
    if got.status_code == 404:
        return None
    return dict(got.raise_for_status().json())


def test_a_validator_serves_the_accounts_of_the_recreated_topics_only(start_validator, prefix) -> None:  # type: ignore[no-untyped-def]
    commands = f"{prefix}account-commands"
    old = start_validator("a", **ENV)
    produce(commands, [create(f"acct-{i}", "old") for i in range(40)])
    wait_for(lambda: account(old, "acct-39") is not None, timeout=60, message="the old accounts created")
    old.stop()

    recreate(BOOTSTRAP, prefix, {})
    other = start_validator("b", **ENV)
    # Fewer accounts, a few of them under names the old topics had too, in another program.
    produce(commands, [create(f"acct-{i}", "new") for i in range(0, 60, 3)])
    wait_for(lambda: account(other, "acct-57") is not None, timeout=60, message="the new accounts created")
    other.stop()

    back = start_validator("a", **ENV)
    wait_for(lambda: account(back, "acct-57") is not None, timeout=60, message="the new accounts served")
    for i in range(40):
        got = account(back, f"acct-{i}")
        if i % 3 == 0:
            assert got is not None and got["program_id"] == "program-new" and got["version"] == 1, got
        else:
            assert got is None, f"acct-{i} of the deleted topics served: {got}"
    assert DISCARDED in log_of(back) and "deleted and created again" in log_of(back)
    assert discarded(back).get("topic_recreated", 0) >= 1
