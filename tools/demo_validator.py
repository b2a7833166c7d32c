"""Sample traffic for the validator, printed for a person: ``run(base_url)``.

One account goes through its life (create, update, deactivate, a stale update,
delete, an update after the delete, a repeated command), then the account, the
command statuses and the program's listing are read back. Then one batch with good,
conflicting and malformed items is sent, resent, and its summary printed.
"""

from __future__ import annotations

import sys
import time
import uuid
from typing import Any

import httpx


def _line(label: str, body: Any) -> None:
    print(f"  {label:<44} {body}")


def _outcome(body: dict[str, Any]) -> str:
    if body.get("status") == "accepted":
        ev = body["event"]
        return f"accepted -> {ev['type']} v{ev['version']} data={ev['data']}"
    if body.get("status") == "rejected":
        return f"rejected -> {body['reason']}: {body['detail']}"
    return f"{body.get('status')} ({body})"


def run(base_url: str) -> None:
    base = base_url.rstrip("/")
    suffix = uuid.uuid4().hex[:6]
    account, program = f"demo-acct-{suffix}", f"demo-program-{suffix}"
    with httpx.Client(base_url=base, timeout=15) as http:
        deadline = time.monotonic() + 90
        while True:
            try:
                if http.get("/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the validator at {base} is not ready")
            time.sleep(0.5)
        print(f"validator at {base}: account {account} in program {program}")

        def send(label: str, command_id: str, type_: str, **fields: Any) -> dict[str, Any]:
            body = {"command_id": f"{account}-{command_id}", "type": type_, "account_id": account, **fields}
            resp = http.post("/commands", params={"wait": "true"}, json=body)
            out: dict[str, Any] = resp.json()
            _line(f"{label} [{resp.status_code}]", _outcome(out))
            return out

        send("CreateAccount", "1", "CreateAccount", program_id=program, data={"name": "Ada", "plan": "basic"})
        send("UpdateAccount (expected_version 1)", "2", "UpdateAccount", expected_version=1, data={"plan": "gold"})
        send("DeactivateAccount", "3", "DeactivateAccount", data={"reason": "asked to pause"})
        send("UpdateAccount (stale expected_version 1)", "4", "UpdateAccount", expected_version=1, data={"plan": "x"})
        send("ReactivateAccount", "5", "ReactivateAccount")
        send("DeleteAccount", "6", "DeleteAccount")
        send("UpdateAccount after the delete", "7", "UpdateAccount", data={"plan": "ghost"})
        send("CreateAccount again (same id)", "8", "CreateAccount", program_id=program)
        send("UpdateAccount repeated (command 2 again)", "2", "UpdateAccount", expected_version=1, data={"plan": "gold"})

        bad = http.post("/commands", json={"type": "Explode", "account_id": account})
        _line(f"a malformed command [{bad.status_code}]", bad.json()["error"])

        print("read back:")
        _line("GET /accounts/{id}", http.get(f"/accounts/{account}").json())
        _line("GET /commands/{id} (command 4)", _outcome(http.get(f"/commands/{account}-4").json()))
        missing = http.get("/commands/no-such-command")
        _line(f"GET /commands/no-such-command [{missing.status_code}]", missing.json())
        for _ in range(20):  # the listing is a projection of account-events: it follows shortly
            listing = http.get(f"/programs/{program}/accounts").json()
            if listing["items"] and listing["items"][0]["status"] == "deleted":
                break
            time.sleep(0.25)
        _line("GET /programs/{id}/accounts", listing)
        send_batch(http, f"demo-batch-{suffix}", program)


def send_batch(http: httpx.Client, batch_id: str, program: str) -> None:
    """A batch mixing good, conflicting and malformed items, sent twice: the second time decides nothing new."""
    member = f"{batch_id}-acct"
    body = {
        "batch_id": batch_id,
        "commands": [
            {"type": "CreateAccount", "account_id": member, "program_id": program},
            {"type": "UpdateAccount", "account_id": member, "expected_version": 1, "data": {"plan": "gold"}},
            {"type": "UpdateAccount", "account_id": member, "expected_version": 1, "data": {"plan": "stale"}},
            {"type": "ReactivateAccount", "account_id": member},
            {"type": "CreateAccount", "account_id": f"{member}-2"},
            "not a command",
        ],
    }
    print(f"a batch of {len(body['commands'])} commands ({batch_id}):")
    for attempt in ("POST /commands/batch?wait=true", "the same batch again"):
        resp = http.post("/commands/batch", params={"wait": "true"}, json=body)
        summary: dict[str, Any] = resp.json()
        _line(f"{attempt} [{resp.status_code}]", summary.get("counts", summary))
    for item in summary.get("items", []):
        outcome = item["status"] if item["status"] != "rejected" else f"rejected -> {item['reason']}: {item['detail']}"
        _line(f"  item {item['index']} ({item['command_id']})", outcome)


if __name__ == "__main__":
    run(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8001")
