"""The validator's reads never wait for one instance either: with the owner of some accounts
SIGKILLed, the survivor answers every account and every command's outcome exactly, from its
standby copies, and says so; ``?max_lag=0`` accepts those copies once they are caught up."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.services import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ACCOUNTS = 40


def create(http: httpx.Client, url: str, n: int) -> dict[str, Any]:
    body = {"command_id": f"create-{n}", "type": "CreateAccount", "account_id": f"acct-{n}", "program_id": "p1"}
    resp = http.post(url + "/commands", params={"wait": "true"}, json=body)
    assert resp.status_code == 200 and resp.json()["status"] == "accepted", resp.text
    answer: dict[str, Any] = resp.json()
    return answer


#: The dead owner's partitions stay unassigned (no peer watch, the default 45 s session timeout),
#: so every read of them in this test is answered from a copy.
NO_FAILOVER = {"STATEFLEET_PEER_WATCH": "false"}


def test_owner_sigkilled_accounts_and_outcomes_answered_from_copies(start_validator: Any) -> None:
    a, b = start_validator("a", **NO_FAILOVER), start_validator("b", **NO_FAILOVER)
    with httpx.Client(timeout=15) as http:
        for n in range(ACCOUNTS):
            create(http, a.url, n)
        owners = {n: http.get(f"{b.url}/accounts/acct-{n}").headers["x-statefleet-served-by"] for n in range(ACCOUNTS)}
        assert a.url in owners.values() and b.url in owners.values(), "both instances should own accounts"

        def standby_caught_up() -> bool:
            # b's copies of a's partitions have applied every change (lag 0) once they are read from it
            return all(
                http.get(f"{b.url}/accounts/acct-{n}", headers={"X-Statefleet-Read-Copy": "1"}).headers.get(
                    "x-statefleet-lag-records"
                )
                == "0"
                for n, url in owners.items()
                if url == a.url
            )

        wait_for(standby_caught_up, timeout=30, message="b's standby copies of a's partitions to catch up")
        a.kill()
        for n in range(ACCOUNTS):
            resp = http.get(f"{b.url}/accounts/acct-{n}", params={"max_lag": 0})
            assert resp.status_code == 200, resp.text
            assert resp.json() == {"account_id": f"acct-{n}", "program_id": "p1", "status": "active", "version": 1}
            expected_source = "standby" if owners[n] == a.url else "active"
            assert resp.headers["x-statefleet-source"] == expected_source, (n, dict(resp.headers))
            assert resp.headers["x-statefleet-lag-records"] == "0"

            outcome = http.get(f"{b.url}/commands/create-{n}")
            assert outcome.status_code == 200, outcome.text
            assert outcome.json()["status"] == "accepted"
            assert outcome.headers["x-statefleet-source"] in ("active", "standby")

        missing = http.get(f"{b.url}/accounts/never-created")
        assert missing.status_code == 404
        assert missing.headers["x-statefleet-source"] in ("active", "standby")
